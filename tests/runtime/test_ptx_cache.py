"""The disk cache of compiled GPU modules (runtime/ptx_cache.py), on any machine: a second process's
compile reads the entry and runs no code generation, anything the PTX follows from changes the key,
and an entry that cannot be read is compiled again and replaced."""
import gzip

import pytest

import llvmlite

from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import ptx_cache
from tests.gpu_helpers import matmul, tiled


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of the test's own."""
    monkeypatch.setenv("LOOPTOOL_CACHE_DIR", str(tmp_path))
    return tmp_path / "ptx"


@pytest.fixture
def tree(rng):
    c, _ = matmul(rng, 50, 32, 70)
    return tiled(c.loop_tree())


def no_codegen(*args, **kwargs):
    raise AssertionError("code generation ran on a cache hit")


def test_a_second_compile_reads_the_entry_without_generating_code(cache, tree, monkeypatch):
    first = ptx_cache.generate(tree, "sm_90")
    assert first == codegen_gpu.generate(tree, "sm_90")
    entries = list(cache.iterdir())
    assert len(entries) == 1 and entries[0].name.endswith(".json.gz")      # no temporary file left behind
    monkeypatch.setattr(codegen_gpu, "generate", no_codegen)
    assert ptx_cache.generate(tree, "sm_90") == first                      # PTX, IR, launches, params, all of it


def test_the_key_follows_program_schedule_arch_flags_and_versions(rng, tree, monkeypatch):
    key = ptx_cache.entry_key(tree, "sm_90", True)
    assert ptx_cache.entry_key(tree, "sm_90", True) == key
    other_program = tiled(matmul(rng, 50, 32, 71)[0].loop_tree())
    changed = [ptx_cache.entry_key(tree, "sm_80", True), ptx_cache.entry_key(tree, "sm_90", False),
               ptx_cache.entry_key(tree.unroll("k"), "sm_90", True), ptx_cache.entry_key(other_program, "sm_90", True)]
    for module, name, value in ((ptx_cache, "__version__", "99.0"), (ptx_cache, "source_digest", lambda: "edited"),
                                (llvmlite, "__version__", "0.0.1"), (ptx_cache, "llvm_version", lambda: "1.0")):
        with monkeypatch.context() as patch:
            patch.setattr(module, name, value)
            changed.append(ptx_cache.entry_key(tree, "sm_90", True))
    assert len(set(changed)) == len(changed) and key not in changed


def test_another_arch_misses(cache, tree):
    ptx_cache.generate(tree, "sm_90")
    assert ".target sm_80" in ptx_cache.generate(tree, "sm_80").ptx
    assert len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("damage", [b"", b"not gzip", gzip.compress(b"{not json"), gzip.compress(b'{"ptx": 1}'),
                                    gzip.compress(b"[]")])
def test_an_unreadable_entry_is_compiled_again_and_replaced(cache, tree, damage):
    fresh = ptx_cache.generate(tree, "sm_90")
    (entry,) = cache.iterdir()
    entry.write_bytes(damage)
    assert ptx_cache.generate(tree, "sm_90") == fresh
    assert ptx_cache.read(entry) == fresh


def test_a_truncated_entry_is_compiled_again(cache, tree):
    fresh = ptx_cache.generate(tree, "sm_90")
    (entry,) = cache.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])
    assert ptx_cache.read(entry) is None
    assert ptx_cache.generate(tree, "sm_90") == fresh and ptx_cache.read(entry) == fresh


def test_an_empty_folder_setting_turns_the_cache_off(tmp_path, tree, monkeypatch):
    monkeypatch.setenv("LOOPTOOL_CACHE_DIR", "")
    assert ptx_cache.cache_dir() is None
    assert ptx_cache.generate(tree, "sm_90") == codegen_gpu.generate(tree, "sm_90")
    monkeypatch.delenv("LOOPTOOL_CACHE_DIR")
    assert ptx_cache.cache_dir().parts[-3:] == (".cache", "looptool", "ptx")
