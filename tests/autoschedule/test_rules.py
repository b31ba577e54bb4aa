"""The rules, from the target's facts: register tiles fit the register file, blocks fit the caches,
threads only where there is work for them, and every choice is explained; refused choices fall back."""
import logging
import re

import numpy as np
import pytest

import looptool as lt
from looptool.analysis.target import Target
from looptool.autoschedule import auto_tree, model
from looptool.runtime import lower_on_host
from looptool.schedule import LoopTree
from tests.helpers import assert_close


def fake(registers=16, bits=256, cores=1, l1=32 * 1024, l2=512 * 1024, l3=32 << 20, l1_ways=8, l2_ways=8):
    return Target("x86_64", bits, registers, True, l1, l2, l3, cores, l1_ways, l2_ways)


def matmul_program(m=200, k=300, n=500):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k)
    return c, lower_on_host(c.node)[0], a.astype(np.float64) @ b


def unrolled_extents(tree):
    loops = tree.schedule.of("t0").loops
    return [lp.extent for lp in loops if lp.annotation == "unroll"], [lp.extent for lp in loops
                                                                      if lp.annotation == "vectorize"]


def test_sixteen_or_thirty_two_registers_change_the_register_tile():
    _, program, _ = matmul_program()
    avx2 = auto_tree(program, fake(16, 256))
    avx512 = auto_tree(program, fake(32, 512))
    assert unrolled_extents(avx2) == ([4, 3], [8])           # 4 rows x 3 vectors of 8 lanes
    rows, vectors = unrolled_extents(avx512)[0]
    assert unrolled_extents(avx512)[1] == [16] and rows * vectors > 12
    assert rows * vectors + vectors + 1 <= 32
    assert "register tile 4x24: 12 accumulators of 8 lanes + 3 operand vectors + 1 broadcast = 16 of 16" \
        in avx2.explain()


@pytest.mark.parametrize("registers", [8, 16, 32])
def test_every_register_tile_fits_the_register_file(registers):
    for rows, columns in [(200, 500), (6, 7), (1000, 16), (3, 1000)]:
        tile = model.register_tile(fake(registers), 8, rows, columns)
        assert tile.registers <= registers and tile.rows <= rows


@pytest.mark.parametrize("cores, columns", [(1, 80), (2, 64)])
def test_a_register_tile_counts_the_busiest_core_of_its_column_tiles(cores, columns):
    """1024 columns: 13 tiles of 80 (5x80, the fewest loads per FMA) on one core; on two, 7 and 6 would keep
    one core busy 7/6.5 of the time, so 16 tiles of 64 (6x64, 8 a core) win (Xeon, 2 threads, 1024^3:
    1.10x, 997x1001x1003 1.07x, 512x1024x1024 1.10x)."""
    tile = model.register_tile(fake(32, 512), 16, 1024, 1024, cores)
    assert tile.columns == columns and tile.registers <= 32
    _, program, _ = matmul_program(1024, 1024, 1024)
    rows = 5 if columns == 80 else 6
    assert f"register tile {rows}x{columns}" in auto_tree(program, fake(32, 512, cores=cores)).explain()


def test_blocks_follow_the_cache_sizes():
    _, program, _ = matmul_program(256, 1024, 1024)
    small = auto_tree(program, fake(l1=8 * 1024, l2=64 * 1024)).schedule.of("t0").loops
    large = auto_tree(program, fake(l1=64 * 1024, l2=2048 * 1024)).schedule.of("t0").loops
    k_block = {lp.name: lp.extent for lp in small}["k.1"], {lp.name: lp.extent for lp in large}["k.1"]
    assert k_block[0] < k_block[1]


@pytest.mark.parametrize("registers, bits, ways, panel_ways, k_block", [
    (16, 256, 8, 6, 256),     # 4x24 tile: 6 ways of 4 KiB hold a 256x24 panel; 1 for the 4-row slice, 1 left
    (32, 512, 12, 10, 128),   # 5x80 tile, 48 KiB 12-way L1: 10 ways of 4 KiB hold a 128x80 panel
    (32, 512, 8, 6, 74),      # the same tile in a 32 KiB 8-way L1: 6 ways hold 76 rows, balanced to 74
])
def test_the_reduction_block_fills_the_l1_ways_its_panel_gets(registers, bits, ways, panel_ways, k_block):
    """BLIS's model: the reused micro-panel gets L1's ways but one for the results and those the
    broadcast operand's slice needs in proportion to its width (results within half of L2: 1 MiB)."""
    _, program, _ = matmul_program(256, 1024, 1024)
    l1 = 48 * 1024 if ways == 12 else 32 * 1024
    target = fake(registers, bits, l1=l1, l2=2048 * 1024, l1_ways=ways)
    tree = auto_tree(program, target)
    rows, vectors = unrolled_extents(tree)[0]
    tile = model.RegisterTile(rows, vectors, bits // 32)
    assert model.panel_ways(target, tile) == panel_ways
    assert {lp.name: lp.extent for lp in tree.schedule.of("t0").loops}["k.1"] == k_block
    assert f"at most {panel_ways} of L1's {ways} ways" in tree.explain()


@pytest.mark.parametrize("registers, bits, l2, ways, size, k_block, from_l2", [
    (32, 512, 2048 << 10, 16, 1024, 342, True),    # 5x80: one 128 KiB way holds 409 rows: 3 x 342
    (32, 512, 2048 << 10, 16, 2048, 342, True),    # 16 MiB of results: 6 x 342
    (16, 256, 512 << 10, 8, 1024, 342, False),     # 4x24 on an 8-way 512 KiB L2: L1's 426 rows (3 x 342)
    (32, 512, 8192 << 10, 16, 1024, 128, False),   # the results fit half of an 8 MiB L2: L1's 128
])
def test_results_that_leave_l2_take_a_reduction_block_whose_panel_is_read_from_l2(registers, bits, l2, ways, size,
                                                                                     k_block, from_l2):
    """Each pass over k reads and writes the results; where they take more than half of L2 they come from L3,
    and where that moves more bytes through L3 than packing the reused operand once per row block, the
    micro-panel is read from L2 instead (one of its ways), for fewer passes: 5x80 at 1024^3 moves 72 MB at
    kc 128 against 32 at 342 (Xeon: 164 -> 171-182 GFLOP/s on one core). A 4x24 tile's wider L1 block keeps
    it (at 682 rows its row blocks, and so its packing, would double)."""
    _, program, _ = matmul_program(size, size, size)
    tree = auto_tree(program, fake(registers, bits, l1=48 * 1024, l2=l2, l1_ways=12, l2_ways=ways))
    assert {lp.name: lp.extent for lp in tree.schedule.of("t0").loops}["k.1"] == k_block
    assert ("would leave L2 between passes" in tree.explain()) == from_l2, tree.explain()
    assert ("micro-panel of in1 stays in L2" in tree.explain()) == from_l2


@pytest.mark.parametrize("registers, bits, whole", [(32, 512, True), (16, 256, False)])
def test_the_whole_reduction_in_one_pass_where_that_moves_fewest_bytes_through_l3(registers, bits, whole):
    """1000x777x1500 (6 MiB of results) on a 2 MiB 16-way L2: 5x80 at L2's kc (389, two passes) moves 42.6 MB
    through L3 by `l3_traffic`, the whole 777 in one pass (a 242 KiB micro-panel, rows in blocks of 335) 40 MB,
    so it takes one pass (Xeon, 1 thread: 0.92 -> 0.95-0.96x OpenBLAS; 2 threads +10 %). A 4x24 tile (AVX2)
    keeps L1's block: its narrow micro-panel leaves row blocks too small to pay for packing B again."""
    c, program, ref = matmul_program(1000, 777, 1500)
    target = fake(registers, bits, l1=48 * 1024, l2=2 << 20, l1_ways=12, l2_ways=16)
    tree = auto_tree(program, target)
    assert ("k.0" not in [lp.name for lp in tree.schedule.of("t0").loops]) == whole
    assert ("whole reduction k, one pass (777 products per result per pass)" in tree.explain()) == whole
    if whole:
        assert_close(c.numpy(tree), ref, 1e-4)


@pytest.mark.parametrize("registers, bits, l2, ways, block_ways, m_block", [
    (16, 256, 512 << 10, 8, 6, 344),    # 4x24, kc 256: 6 ways of 64 KiB hold 384 rows, balanced to 3 x 344
    (16, 256, 1 << 20, 16, 14, 512),    # 1 MiB in 16 ways of 64 KiB: 14 hold 896 rows, balanced to 2 x 512
    (32, 512, 128 << 10, 8, 5, 260),    # 5x80, kc 74 (L1's; L2's 51): the 23 KiB micro-panel takes 2 ways of 16 KiB
])
def test_the_broadcast_block_gets_the_l2_ways_the_micro_panels_leave(registers, bits, l2, ways, block_ways, m_block):
    """BLIS's model for L2: the mc x kc block of the broadcast operand gets L2's ways but one for the results
    and those a kc x nr micro-panel of the reused operand fills on its way to L1; odd sizes stay correct."""
    _, program, _ = matmul_program(1024, 1024, 1024)
    target = fake(registers, bits, l2=l2, l2_ways=ways)
    tree = auto_tree(program, target)
    assert re.search(r"m block (\d+)", tree.explain()).group(1) == str(m_block)
    assert f"{block_ways} of L2's {ways} ways at most" in tree.explain()
    c, odd, ref = matmul_program(257, 511, 129)
    assert_close(c.numpy(auto_tree(odd, fake(registers, bits, l2=l2 // 16, l2_ways=ways))), ref, 1e-5)


@pytest.mark.parametrize("registers, bits", [(16, 256), (32, 512)])
def test_the_column_panel_lives_in_a_thread_s_share_of_l3(registers, bits):
    """The kc x nc panel of the reused operand is sized to half of L3 / cores: a 32 MiB L3 leaves
    1024 columns unblocked, a 256 KiB one blocks them, and more cores give each a smaller share (results
    within half of L2, so kc stays L1's)."""
    _, program, _ = matmul_program(64, 1024, 1024)

    def column_block(target):
        found = re.search(r"n block (\d+)", auto_tree(program, target).explain())
        return int(found.group(1)) if found else 1024
    assert column_block(fake(registers, bits)) == 1024
    small = column_block(fake(registers, bits, l3=256 << 10))
    assert small < 1024
    assert column_block(fake(registers, bits, l3=512 << 10, cores=4)) < small


@pytest.mark.parametrize("registers, bits", [(16, 256), (32, 512)])
def test_the_reused_operand_is_packed_by_the_register_tile_s_vectors(registers, bits):
    """Each row of a packed micro-panel is copied as the tile reads it: the copy's lane loop vectorized (8 or
    16 lanes), its vector loop unrolled; odd sizes, so the last column tile is cut inside a vector. A
    transposed operand (gathered lane by lane) keeps its scalar copy."""
    c, program, ref = matmul_program(257, 511, 129)
    tree = auto_tree(program, fake(registers, bits))
    copy = tree.schedule.of("in1.t0").loops
    assert (copy[-1].annotation, copy[-1].extent) == ("vectorize", bits // 32)
    assert copy[-2].annotation == "unroll" and copy[-2].dim == "n"
    assert "each row copied by the register tile's vectors" in tree.explain()
    assert_close(c.numpy(tree), ref, 1e-5)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((257, 511), dtype=np.float32), rng.standard_normal((129, 511), dtype=np.float32)
    s = lt.symbols("m k n")
    transposed = (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.n, s.k)).sum(s.k)     # B stored n-major
    tree = auto_tree(lower_on_host(transposed.node)[0], fake(registers, bits))
    assert "pack in1" in tree.explain() and "by the register tile's vectors" not in tree.explain()
    assert "vectorize" not in [lp.annotation for lp in tree.schedule.of("in1.t0").loops]
    assert_close(transposed.numpy(tree), a.astype(np.float64) @ b.T, 1e-5)


@pytest.mark.parametrize("registers, bits", [(16, 256), (32, 512)])
def test_a_packed_panel_of_the_whole_reduction_is_copied_row_by_row(registers, bits):
    """A reduction short enough to need no block (k = 129 with a large L1) is copied in the panel's layout
    too: the reduction outermost, each row by the tile's vectors (it came columns outer, k innermost: a
    scalar copy down each column)."""
    c, program, ref = matmul_program(257, 129, 511)
    tree = auto_tree(program, fake(registers, bits, l1=64 * 1024, l1_ways=16))
    assert "k.0" not in [lp.name for lp in tree.schedule.of("t0").loops]
    copy = tree.schedule.of("in1.t0").loops
    assert [lp.dim for lp in copy] == ["k", "n", "n"]
    assert (copy[-1].annotation, copy[-1].extent) == ("vectorize", bits // 32)
    assert "each row copied by the register tile's vectors" in tree.explain()
    assert_close(c.numpy(tree), ref, 1e-5)


@pytest.mark.parametrize("registers, bits", [(16, 256), (32, 512)])
def test_the_broadcast_operand_is_packed_when_its_rows_crowd_sets_of_l2(registers, bits):
    """512 rows 2 KiB apart: a row block's rows fall in every 32nd line of L2's 64 KiB ways, so some
    set would hold more of its lines than the block's ways, and it is copied (rows outer, reductions
    inner) once per reduction block; 200x300 rows (1200 bytes apart) spread over the sets and are not.
    (128 columns: the results fit half of L2, so that the reduction block is L1's.)"""
    c, program, ref = matmul_program(512, 512, 128)
    tree = auto_tree(program, fake(registers, bits))
    assert "pack in0 as (m, k)" in tree.explain()
    assert_close(c.numpy(tree), ref, 1e-5)
    _, small, _ = matmul_program(200, 300, 500)
    explained = auto_tree(small, fake(registers, bits)).explain()
    assert "pack in0" not in explained and "in0 read in place" in explained


@pytest.mark.parametrize("m, k, n, m_block, capped", [(997, 1001, 1003, 500, True), (1024, 1024, 1024, None, False)])
def test_a_broadcast_block_read_in_place_gets_half_of_l2_at_most(m, k, n, m_block, capped):
    """5x80 on a 2 MiB 16-way L2 (kc 334 from L2): 997 rows of the broadcast operand read in place (4004 bytes
    apart, 12 lines a set) would make one 1.3 MiB block in 14 ways; read in place a block takes more of L2
    than its bytes, so it gets half of L2 at most: two blocks of 500 (Xeon: 0.91 -> 0.96x OpenBLAS). 1024 rows
    4 KiB apart crowd sets and are packed, and a packed block keeps its 14 ways (1024 rows, one block)."""
    _, program, _ = matmul_program(m, k, n)
    target = fake(32, 512, l1=48 * 1024, l2=2 << 20, l1_ways=12, l2_ways=16)
    tree = auto_tree(program, target)
    found = re.search(r"m block (\d+)", tree.explain())
    assert (found and int(found.group(1))) == m_block
    assert ("and half of L2 (read in place) at most" in tree.explain()) == capped
    assert ("in0 read in place" in tree.explain()) == capped
    tile = model.RegisterTile(5, 5, 16)
    assert model.block_room(target, tile, 334, 4, in_place=True) == 1 << 20
    assert model.block_room(target, tile, 334, 4, in_place=False) == 14 * (128 << 10)


@pytest.mark.parametrize("registers, bits, l2", [(16, 256, 512 * 1024), (32, 512, 1 << 20)])
def test_a_broadcast_block_that_spans_half_of_l2_but_spreads_over_its_sets_is_read_in_place(registers, bits, l2):
    """Issue #27: 257 rows of 511 floats span 513 KiB, more than half of a 1 MiB L2, and the rule before
    copied them once per reduction block (5 % of the call on the Zen 4, AVX-512); 2044 bytes apart, their
    kc-long pieces put at most 2 lines in a set of L2, within the block's ways, so they are read in place.
    129 rows likewise on AVX2's 512 KiB L2; 256 rows 2 KiB apart there crowd every 32nd line (8 a set)."""
    target = fake(registers, bits, l2=l2)
    c, program, ref = matmul_program(257, 511, 129)
    tree = auto_tree(program, target)
    if bits == 512:
        assert "in0 read in place: its 257x73 block puts at most 2 lines in one set of L2" in tree.explain()
        assert_close(c.numpy(tree), ref, 1e-5)
    else:
        assert "pack in0 as (m, k)" in tree.explain()      # 257x256: 8 lines a set
        assert "in0 read in place" in auto_tree(matmul_program(129, 511, 257)[1], target).explain()
        assert "pack in0 as (m, k)" in auto_tree(matmul_program(256, 512, 128)[1], target).explain()


def test_set_load_counts_the_lines_of_a_block_in_the_fullest_set_of_l2():
    """8 rows a way apart (64 KiB in a 512 KiB 8-way L2 of 64-byte lines) fall in the same sets: 8 lines a
    set; 8 rows one line apart fill 8 sets once each."""
    target = fake(l2=512 * 1024, l2_ways=8)
    pieces = np.arange(16) * 4                        # 16 floats: one line a row
    assert model.set_load(target, np.add.outer(np.arange(8) * 65536, pieces)) == 8
    assert model.set_load(target, np.add.outer(np.arange(8) * 64, pieces)) == 1


def test_threads_only_with_several_cores_and_enough_work():
    _, program, _ = matmul_program()
    annotations = lambda tree: [lp.annotation for lp in tree.schedule.of("t0").loops]  # noqa: E731
    assert "parallel" not in annotations(auto_tree(program, fake(cores=1)))
    assert "parallel" in annotations(auto_tree(program, fake(cores=4)))
    _, tiny, _ = matmul_program(8, 8, 8)
    assert "parallel" not in annotations(auto_tree(tiny, fake(cores=4)))


@pytest.mark.parametrize("bits, size, threads", [(512, 64, False), (256, 64, False), (512, 128, True),
                                                 (256, 128, True), (512, 96, False), (256, 96, False)])
def test_a_contractions_work_is_counted_in_vector_instructions(bits, size, threads):
    """A 64^3 matmul is 16384 multiply-adds of 16 lanes on AVX-512: less than two threads' start and join
    are worth (WORK_PER_THREAD each), so it runs on one (it ran 2.2x slower on two). 128^3 is worth it."""
    _, program, _ = matmul_program(size, size, size)
    parallel = [lp for lp in auto_tree(program, fake(32, bits, cores=2)).schedule.of("t0").loops
                if lp.annotation == "parallel"]
    assert bool(parallel) is threads


@pytest.mark.parametrize("registers, bits, tiles", [(32, 512, 6), (16, 256, 18)])
def test_threads_take_the_loop_whose_busiest_core_finishes_first_regions_counted(registers, bits, tiles):
    """331x277x413 on two cores: 64-wide tiles would give 7 column tiles (4 and 3 a core), so AVX-512 takes
    5x80 tiles, 6 of them (3 a core: `register_tile` counts the busiest core); its row tiles split evenly
    but stay inside the k blocks and column tiles (a row loop moved out would repack the reused operand),
    so they would open 3 x 7 = 21 parallel regions a call. The column tiles win: 0.496 ms a call against
    0.517 (Zen 4, 2 threads, 7 column tiles). AVX2's 18 column tiles win anyway. (The Zen 4's 1 MiB L2 holds
    each core's results, so the reduction keeps L1's blocks.)"""
    _, program, ref = matmul_program(331, 277, 413)
    target = fake(registers, bits, cores=2, l2=1 << 20)
    tree = auto_tree(program, target)
    assert f"t0: parallel n.0: {tiles} iterations for 2 cores" in tree.explain()
    assert "parallel n.0 outermost: one parallel region per call" in tree.explain()
    work = 331 * 277 * 413 // target.lanes("float32")
    assert model.threaded_time(target, 7, work, 1) < model.threaded_time(target, 56, work, 21)
    assert model.threaded_time(target, 56, work, 1) < model.threaded_time(target, 7, work, 1)
    assert_close(lt.Kernel(tree, 2)(lower_on_host(matmul_program(331, 277, 413)[0].node)[1]), ref, 1e-5)


def test_a_parallel_loop_over_the_rows_of_a_large_image_runs_outermost(rng):
    """A 3x3 conv's 2-thread schedule: its output rows (oh) go to the threads; the image is larger than
    half of L2, but each row reads only its own input rows, so the parallel loop is the outermost (one
    parallel region a call), not inside every reduction block; the result matches NumPy."""
    x = rng.standard_normal((1, 64, 24, 24)).astype(np.float32)             # 144 KiB: more than half of L2
    w = rng.standard_normal((24, 64, 3, 3)).astype(np.float32)
    sn, sc, h, wd, so, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
    windows = lt.Tensor(x).to(sn, sc, h, wd).window(h, oh, kh, 3, padding=1).window(wd, ow, kw, 3, padding=1)
    conv = (windows * lt.Tensor(w).to(so, sc, kh, kw)).sum(sc, kh, kw)
    tree = auto_tree(lower_on_host(conv.node)[0], fake(cores=2, l2=64 * 1024))
    assert [(node.loop.name, node.loop.annotation) for node in tree.root] == [("oh", "parallel")]
    assert "reduction block c by 22" in tree.explain() and "parallel oh outermost" in tree.explain()
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 24, 24, 24))
    for i in range(3):
        for j in range(3):
            ref += np.einsum("nchw,oc->nhwo", padded[:, :, i:i + 24, j:j + 24], w[:, :, i, j].astype(np.float64))
    assert_close(lt.interpret(conv, tree), ref, 1e-5)


def test_a_refused_choice_falls_back_and_says_so_at_debug_level(monkeypatch, caplog):
    """Threads refused (as if isl had found a race): the schedule without them is used, and logged."""
    c, program, ref = matmul_program(128, 64, 256)
    real_check = LoopTree.check

    def no_threads(tree):
        if any(lp.annotation == "parallel" for _, sched in tree.schedule.stages for lp in sched.loops):
            return False, "made-up race for the test"
        return real_check(tree)
    monkeypatch.setattr(LoopTree, "check", no_threads)
    with caplog.at_level(logging.DEBUG, logger="looptool"):
        tree = auto_tree(program, fake(cores=4))
    assert "made-up race for the test" in caplog.text
    assert "fell back to a schedule without threads" in tree.explain()
    assert not any(lp.annotation == "parallel" for lp in tree.schedule.of("t0").loops)
    monkeypatch.undo()
    assert_close(c.numpy(tree), ref, 1e-5)


def test_auto_from_a_tree_replaces_its_reshaping_and_explains_it():
    c, _, _ = matmul_program(32, 16, 40)
    reshaped = c.loop_tree().split("m", 4)
    assert "not made by auto()" in reshaped.explain()
    tree = reshaped.auto()
    assert tree.schedule.steps and tree.explain().count("\n") >= 2
    assert "register tile" in tree.explain()


def test_numpy_compile_and_export_use_the_automatic_schedule_and_loop_tree_stays_default(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", "")
    c, _, ref = matmul_program(24, 20, 28)
    assert c.loop_tree().schedule.steps == ()
    automatic = lt.auto_schedule(c)
    assert c.compile().tree.schedule.steps == automatic.schedule.steps
    assert_close(c.numpy(), ref, 1e-5)


@pytest.mark.parametrize("bits, cols, op, lanes", [(256, 1024, "max", 64), (512, 1024, "max", 128), (256, 1024, "sum", 32),
                                                   (512, 256, "max", 64), (256, 1024, "min", 64), (512, 1024, "sum", 64)])
def test_a_max_or_min_over_a_long_row_keeps_twice_the_vectors_of_partial_results(bits, cols, op, lanes):
    """A max or min propagates NaN, a chain of instructions a step: over rows long enough to give each of
    8 vectors 4 steps it keeps 8 vectors of partial results, a sum 4; a row of 256 on AVX-512 keeps 4."""
    x = np.random.default_rng(0).standard_normal((64, cols)).astype(np.float32)
    r, c = lt.symbols("r c")
    t = getattr(lt.Tensor(x).to(r, c), op)(c)
    tree = auto_tree(lower_on_host(t.node)[0], fake(16 if bits == 256 else 32, bits))
    assert [lp.extent for lp in tree.schedule.of("t0").loops if lp.annotation == "vectorize"] == [lanes]
    assert (f"kept as {lanes * 32 // bits} vectors of partial results: a {op} combines in a chain" in tree.explain()) \
        == (lanes * 32 // bits == 8)
    assert_close(t.numpy(tree), getattr(x.astype(np.float64), op)(axis=1), 1e-6)
