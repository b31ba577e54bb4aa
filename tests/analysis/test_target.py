"""The target model: vector registers from LLVM features, cache sizes from sysfs (or the fallbacks); another
CPU's (LOOPTOOL_CPU) from what LLVM generates for it."""
import numpy as np
import pytest

import looptool as lt
from looptool.analysis import target


def write_cache(root, index, level, kind, size, ways=None):
    folder = root / f"index{index}"
    folder.mkdir(parents=True)
    (folder / "level").write_text(f"{level}\n")
    (folder / "type").write_text(f"{kind}\n")
    (folder / "size").write_text(f"{size}\n")
    if ways is not None:
        (folder / "ways_of_associativity").write_text(f"{ways}\n")


@pytest.mark.parametrize("level, kind, reader, default", [
    (1, "Data", "l1_ways", "DEFAULT_L1_WAYS"), (2, "Unified", "l2_ways", "DEFAULT_L2_WAYS")])
def test_a_cache_level_s_associativity_is_read_from_sysfs_or_falls_back(tmp_path, monkeypatch, level, kind,
                                                                        reader, default):
    write_cache(tmp_path, 0, 1, "Instruction", "32K", ways=8)
    write_cache(tmp_path, 1, 1, "Data", "48K", ways=12)
    write_cache(tmp_path, 2, 2, "Unified", "2048K", ways=16)
    assert getattr(target, reader)(tmp_path) == {1: 12, 2: 16}[level]
    monkeypatch.setattr(target.os, "sysconf", lambda name: 0)
    assert getattr(target, reader)(tmp_path / "missing") == getattr(target, default)


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



# LOOPTOOL_CPU: another CPU's target ---------------------------------------------------------------
x86_only = pytest.mark.skipif(not target.llvm_cpu().triple.startswith("x86_64"), reason="x86 CPU names")
HOST_FEATURES = dict(target.llvm.get_host_cpu_features().items())
needs_avx2_host = pytest.mark.skipif(not (HOST_FEATURES.get("avx2") and HOST_FEATURES.get("fma")),
                                     reason="this host cannot run AVX2 code")


@pytest.fixture
def cpu_from_environment(monkeypatch):
    """The process's target read again from the environment the test sets, and again after it."""
    target.llvm_cpu.cache_clear()
    target.host.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    target.llvm_cpu.cache_clear()
    target.host.cache_clear()


@x86_only
@needs_avx2_host
def test_a_named_cpu_has_the_registers_llvm_generates_for_it_and_no_host_caches():
    zen2 = target.target_of(target.named_cpu("znver2"))
    assert (zen2.vector_bits, zen2.vector_registers, zen2.fma) == (256, 16, True)
    assert zen2.cache_bytes == (target.DEFAULT_L1, target.DEFAULT_L2, target.DEFAULT_L3)
    assert zen2.l1_ways == target.DEFAULT_L1_WAYS and zen2.cores == target.host().cores
    planned = target.target_of(target.named_cpu("znver2"), "32K, 512K, 16M")
    assert planned.cache_bytes == (32 << 10, 512 << 10, 16 << 20)
    assert target.target_of(target.named_cpu("haswell:-fma")).fma is False
    assert target.target_of(target.named_cpu("x86-64")).vector_bits == 128


@x86_only
@needs_avx2_host
def test_the_variable_changes_the_target_the_scheduler_reads(cpu_from_environment):
    from looptool.autoschedule import auto_tree
    from looptool.runtime import lower_on_host
    s = lt.symbols("m k n")
    rng = np.random.default_rng(0)
    c = (lt.Tensor(rng.random((70, 90), dtype=np.float32)).to(s.m, s.k) *
         lt.Tensor(rng.random((90, 100), dtype=np.float32)).to(s.k, s.n)).sum(s.k)
    program = lower_on_host(c.node)[0]
    cpu_from_environment.setenv("LOOPTOOL_CPU", "znver2")
    cpu_from_environment.setenv("LOOPTOOL_CPU_CACHES", "32K,512K,16M")
    read = target.host()
    assert (target.llvm_cpu().name, read.vector_bits, read.vector_registers) == ("znver2", 256, 16)
    assert (read.l2, read.l3) == (512 << 10, 16 << 20)
    explained = auto_tree(program).explain()          # no target given: the scheduler reads host()
    assert explained.startswith("x86_64: 16 vector registers of 256 bits, FMA; L1 32 KiB, L2 512 KiB, L3 16384 KiB")
    assert "of 8 lanes" in explained and "of 16 registers" in explained
    cpu_from_environment.delenv("LOOPTOOL_CPU")
    cpu_from_environment.delenv("LOOPTOOL_CPU_CACHES")
    target.llvm_cpu.cache_clear()
    target.host.cache_clear()
    assert target.llvm_cpu().setting is None and target.llvm_cpu().name == target.llvm.get_host_cpu_name()


@x86_only
@pytest.mark.parametrize("setting, message", [
    ("nosuchcpu", "LOOPTOOL_CPU='nosuchcpu': 'nosuchcpu' is not a recognized processor"),
    ("znver2:+nosuchfeature", "LOOPTOOL_CPU='znver2:\\+nosuchfeature': '\\+nosuchfeature' is not a recognized feature"),
    ("znver2:avx2", "LOOPTOOL_CPU='znver2:avx2': .* each feature with \\+ or -.*; not avx2"),
    (":+avx2", "LOOPTOOL_CPU=':\\+avx2': no CPU name"),
])
def test_a_setting_llvm_does_not_know_is_refused_naming_the_variable_and_value(setting, message):
    with pytest.raises(lt.TargetError, match=message):
        target.named_cpu(setting)


@pytest.mark.parametrize("setting", ["32K,512K", "32K,lots,16M", "512K,32K,16M", "0K,512K,16M"])
def test_bad_cache_sizes_are_refused_naming_the_variable_and_value(setting):
    with pytest.raises(lt.TargetError, match=f"LOOPTOOL_CPU_CACHES='{setting}': give the L1 data, L2 and L3"):
        target.named_caches(setting)


def test_a_cpu_whose_code_this_host_could_not_run_is_refused():
    avx512 = target.LlvmCpu("x86_64-unknown-linux-gnu", "skylake-avx512", "", "skylake-avx512")
    probed = {"avx512f": True, "avx": True, "sse2": True, "fma": True}
    avx2_host = {"avx512f": False, "avx2": True, "avx": True, "sse2": True, "fma": True}
    with pytest.raises(lt.TargetError, match="LOOPTOOL_CPU='skylake-avx512': code for skylake-avx512 uses "
                                             "512-bit vectors \\(this host has 256-bit ones\\)"):
        target.check_runs_here(avx512, probed, avx2_host)
    amx = target.LlvmCpu("x86_64-unknown-linux-gnu", "znver2", "+amx-tile", "znver2:+amx-tile")
    with pytest.raises(lt.TargetError, match="uses amx-tile, which this host"):
        target.check_runs_here(amx, {"avx": True, "sse2": True, "fma": True}, avx2_host)
    target.check_runs_here(target.LlvmCpu("x86_64-unknown-linux-gnu", "znver2", "", "znver2"),
                           {"avx": True, "sse2": True, "fma": True}, avx2_host)     # AVX2 on an AVX2 host: fine
