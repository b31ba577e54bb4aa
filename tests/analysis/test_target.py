"""The target model: vector registers from LLVM features, cache sizes from sysfs (or the fallbacks)."""
import pytest

from looptool.analysis import target


def write_cache(root, index, level, kind, size, ways=None):
    folder = root / f"index{index}"
    folder.mkdir(parents=True)
    (folder / "level").write_text(f"{level}\n")
    (folder / "type").write_text(f"{kind}\n")
    (folder / "size").write_text(f"{size}\n")
    if ways is not None:
        (folder / "ways_of_associativity").write_text(f"{ways}\n")


def test_l1_associativity_is_read_from_the_data_cache_or_falls_back(tmp_path, monkeypatch):
    write_cache(tmp_path, 0, 1, "Instruction", "32K", ways=8)
    write_cache(tmp_path, 1, 1, "Data", "48K", ways=12)
    assert target.l1_ways(tmp_path) == 12
    monkeypatch.setattr(target.os, "sysconf", lambda name: 0)
    assert target.l1_ways(tmp_path / "missing") == target.DEFAULT_L1_WAYS


def test_cache_sizes_are_read_from_a_sysfs_folder_skipping_instruction_caches(tmp_path):
    write_cache(tmp_path, 0, 1, "Data", "48K")
    write_cache(tmp_path, 1, 1, "Instruction", "32K")
    write_cache(tmp_path, 2, 2, "Unified", "2048K")
    write_cache(tmp_path, 3, 3, "Unified", "32M")
    assert target.cache_sizes(tmp_path) == {1: 48 * 1024, 2: 2048 * 1024, 3: 32 * 1024 ** 2}


def test_missing_cache_levels_fall_back_to_sysconf_or_the_documented_defaults(tmp_path, monkeypatch):
    write_cache(tmp_path, 0, 1, "Data", "64K")
    monkeypatch.setattr(target.os, "sysconf", lambda name: 0)
    assert target.cache_sizes(tmp_path) == {1: 64 * 1024, 2: target.DEFAULT_L2, 3: target.DEFAULT_L3}


def test_an_unreadable_sysfs_entry_is_skipped(tmp_path, monkeypatch):
    write_cache(tmp_path, 0, 1, "Data", "not a size")
    monkeypatch.setattr(target.os, "sysconf", lambda name: 0)
    assert target.cache_sizes(tmp_path)[1] == target.DEFAULT_L1


@pytest.mark.parametrize("triple, features, expected", [
    ("x86_64-unknown-linux-gnu", {"avx512f": True, "avx2": True, "avx": True, "sse2": True}, (512, 32)),
    ("x86_64-unknown-linux-gnu", {"avx512f": False, "avx2": True, "avx": True, "sse2": True}, (256, 16)),
    ("x86_64-unknown-linux-gnu", {"avx": False, "sse2": True}, (128, 16)),
    ("aarch64-unknown-linux-gnu", {"neon": True}, (128, 32)),
])
def test_vector_registers_follow_the_llvm_features(triple, features, expected):
    assert target.vector_file(triple, features) == expected


def test_lanes_depend_on_the_element_size():
    fake = target.Target("x86_64", 256, 16, True, 32768, 524288, 8 << 20, 2)
    assert (fake.lanes("float32"), fake.lanes("float64")) == (8, 4)


def test_the_host_target_is_consistent_with_this_process():
    here = target.host()
    assert here.vector_bits in (64, 128, 256, 512) and here.vector_registers in (8, 16, 32)
    assert 0 < here.l1 <= here.l2 <= here.l3 and here.cores >= 1
    assert here.with_cores(1).cores == 1 and here.with_cores(1).vector_bits == here.vector_bits


def test_parse_size_reads_sysfs_units():
    assert [target.parse_size(t) for t in ("32K", "1M", "4096", "2G")] == [32768, 1 << 20, 4096, 2 << 30]

