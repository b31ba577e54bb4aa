"""The notebook experience: the schedule editor's core, its widget layer, the terminal fallback,
and every notebook under notebooks/ executed end to end."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import looptool as lt
from looptool.notebook import ActionResult, ScheduleEditor, estimate_flops, run_command, tree_html
from tuner import workloads

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(autouse=True)
def no_tuning_db(monkeypatch, tmp_path):
    """Never read or write the user's tuning database or study storage."""
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    monkeypatch.setenv("LOOPTOOL_STORAGE", f"sqlite:///{tmp_path / 'studies.sqlite'}")


def matmul(m=24, k=40, n=48, seed=0):
    rng = np.random.default_rng(seed)
    a_np = rng.standard_normal((m, k), dtype=np.float32)
    b_np = rng.standard_normal((k, n), dtype=np.float32)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a_np).to(s.m, s.k) * lt.Tensor(b_np).to(s.k, s.n)).sum(s.k)
    return c, a_np, b_np


def softmax(rows=8, cols=32, seed=0):
    work = workloads.softmax(rows, cols, seed)
    return work.tensor, work.baseline


@pytest.fixture
def editor():
    c, a_np, b_np = matmul()
    ed = ScheduleEditor(c, baseline=lambda: a_np @ b_np, repeats=3, budget_seconds=0.02)
    ed.a_np, ed.b_np = a_np, b_np
    yield ed
    ed.close()


# The core ---------------------------------------------------------------------------------
def test_initial_state_measures_default_and_baseline(editor):
    r = editor.current
    assert r.status == "applied" and r.legal and r.index == 0
    assert r.seconds > 0 and r.default_seconds == r.seconds and r.baseline_seconds > 0
    assert r.gflops == pytest.approx(2 * 24 * 40 * 48 / r.seconds / 1e9)
    assert r.relative_error < 1e-5
    assert editor.stages() == ["t0"] and editor.loops() == ["m", "k", "n"]
    assert (editor.stage, editor.loop) == ("t0", "m")


def test_select_and_split(editor):
    assert editor.select("t0", "n") == ("t0", "n")
    r = editor.split(16)
    assert r.applied and r.legal and r.reason == "legal" and r.seconds > 0
    assert editor.loops() == ["m", "k", "n.0", "n.1"]
    assert editor.loop == "n.1", "after a split the inner loop is selected"
    assert editor.schedule.steps == (("split", "t0", "n", 16),)
    assert "for n.1 in 0..16" in editor.text()
    assert editor.vectorize().applied and "[vectorize]" in editor.text()
    with pytest.raises(ValueError, match="no loop 'x'"):
        editor.select("t0", "x")
    with pytest.raises(ValueError, match="no stage"):
        editor.select("nope")


def test_move_and_reorder(editor):
    editor.select("t0", "k")
    assert editor.move_out().applied
    assert editor.loops() == ["k", "m", "n"] and editor.loop == "k"
    r = editor.move_out()
    assert r.status == "refused" and "already the outermost" in r.reason
    assert editor.move_in().applied and editor.loops() == ["m", "k", "n"]
    assert editor.reorder("n", "k", "m").applied and editor.loops() == ["n", "k", "m"]


def test_illegal_move_shows_reason_and_leaves_schedule_unchanged(editor):
    editor.select("t0", "n")
    editor.split(8)
    before_tree, before_json, before_current = editor.tree, editor.schedule.to_json(), editor.current
    editor.select("t0", "k")
    r = editor.parallel()
    assert r.status == "illegal" and not r.legal and not r.applied
    assert "loop 'k' cannot be parallel" in r.reason and "dependence" in r.reason
    assert editor.tree is before_tree and editor.schedule.to_json() == before_json
    assert editor.current is before_current
    assert r.seconds == before_current.seconds, "an illegal result reports the unchanged schedule's timing"
    assert "(schedule unchanged)" in str(r)
    # a vectorized outer loop: a structural rule, also explained
    r = editor.vectorize("m")
    assert r.status == "illegal" and "innermost" in r.reason and editor.schedule.to_json() == before_json
    # refused transforms (the schedule API says no) leave it unchanged too
    editor.max_unroll = 32      # k has 40 iterations
    for r in (editor.split(0), editor.split(4, "nope"), editor.annotate("bogus"), editor.unroll("k")):
        assert r.status == "refused" and not r.legal and r.reason, r
    assert "huge kernel" in editor.results[-1].reason
    assert editor.schedule.to_json() == before_json
    # illegal and refused attempts are recorded but not part of the measured history
    assert [h.action for h in editor.history()] == ["default schedule", "split t0.n by 8"]


def test_undo(editor):
    assert editor.undo().status == "refused"
    default_json = editor.schedule.to_json()
    editor.select("t0", "n")
    editor.split(16)
    after_split = editor.schedule.to_json()
    editor.vectorize()
    r = editor.undo()
    assert r.applied and editor.schedule.to_json() == after_split
    assert "[vectorize]" not in editor.text()
    editor.undo()
    assert editor.schedule.to_json() == default_json and editor.loops() == ["m", "k", "n"]
    assert editor.loop in editor.loops()
    assert editor.reset().status == "applied"


def test_results_match_numpy(editor):
    editor.select("t0", "n")
    editor.split(16)
    editor.vectorize()
    editor.select("t0", "m")
    editor.split(4)
    editor.reorder("m.0", "k", "m.1")
    editor.unroll("m.1")
    editor.cache("in1")
    assert editor.stage == "in1.t0", "the copy stage is selected after cache"
    assert editor.place("in1.t0", 2).applied
    assert [r.status for r in editor.results[1:]] == ["applied"] * 7
    assert all(r.relative_error < 1e-5 for r in editor.history())
    got = editor.tensor.numpy(editor.tree)
    np.testing.assert_allclose(got, editor.a_np @ editor.b_np, rtol=1e-4, atol=1e-4)
    assert "in1.t0: f32[" in editor.text() and "local" in editor.text()


def test_softmax_place(editor):
    t, ref = softmax()
    ed = ScheduleEditor(t, baseline=ref, repeats=2, budget_seconds=0.01)
    assert ed.stages() == ["t0", "t1", "t2"]
    assert ed.consumers("t0") == ["t1", "t2"] and ed.consumers("t1") == ["t2"]
    assert ed.current.gflops is None, "softmax is not a sum of products: no GFLOP/s"
    r = ed.place("t0", 1)
    assert r.status == "refused" and "name the consumer" in r.reason
    r = ed.place("t1", 2)
    assert r.status == "illegal" and "broken at loop 'n'" in r.reason and ed.schedule.steps == ()
    assert ed.place("t1", 1).applied and ed.schedule.of("t1").consumer == "t2"
    assert ed.shared_loops("t1") == ["m"]
    assert ed.place("t0", 1, "t1").applied
    np.testing.assert_allclose(t.numpy(ed.tree), ref(), rtol=1e-5, atol=1e-6)
    assert ed.place("t1", 0).applied and ed.schedule.of("t1").consumer is None


def test_apply_steps_and_json(editor):
    r = editor.apply([("split", "t0", "n", 16), ("annotate", "t0", "n.1", "vectorize")])
    assert r.applied and editor.loops() == ["m", "k", "n.0", "n.1"]
    editor.undo()
    assert editor.apply(r.schedule).applied
    assert editor.schedule.to_json() == r.schedule


def test_measure_false_checks_legality_only():
    c, _, _ = matmul()
    ed = ScheduleEditor(c, measure=False)
    assert ed.current.seconds is None
    assert ed.split(8, "n").applied and ed.results[-1].seconds is None
    assert ed.parallel("k").status == "illegal"


def test_flops_estimate():
    c, _, _ = matmul(3, 5, 7)
    program = c.loop_tree().program
    assert estimate_flops(program) == 2 * 3 * 5 * 7
    t, _ = softmax()
    assert estimate_flops(t.loop_tree().program) is None


def test_tree_html_highlights_selected_loop(editor):
    editor.select("t0", "n")
    html = editor.html()
    assert html.startswith("<pre") and html.count("background:#ffe08a") == 2   # init nest and update nest
    assert "t0[m, n] += (in0[m, k] * in1[k, n])" in html
    assert tree_html(editor.tree).count("background:#ffe08a") == 0


def test_plot_png(editor):
    editor.split(8, "n")
    png = editor.plot_png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000


def test_export_and_load(editor, tmp_path):
    editor.split(16, "n")
    editor.vectorize()
    r = editor.export(tmp_path / "artifact")
    assert r.status == "exported" and "manifest.json" in r.reason
    manifest = json.loads((tmp_path / "artifact" / "manifest.json").read_text())
    assert manifest["schedule"]["steps"] == [list(s) for s in editor.schedule.steps]
    assert manifest["tuning"]["source"] == "looptool.notebook"
    out = lt.load(tmp_path / "artifact")(editor.a_np, editor.b_np)
    np.testing.assert_allclose(out, editor.a_np @ editor.b_np, rtol=1e-4, atol=1e-4)
    bad = editor.export(tmp_path / "artifact" / "manifest.json" / "x")
    assert bad.status == "error" and not bad.applied


def test_tune_from_here_keeps_the_faster(tmp_path):
    c, a_np, b_np = matmul(16, 32, 32)
    ed = ScheduleEditor(c, baseline=lambda: a_np @ b_np, repeats=3, budget_seconds=0.02)
    ed.split(8, "n")          # a deliberately slow schedule: the tuner's best should win
    before = ed.current
    r = ed.tune(trials=3, storage=f"sqlite:///{tmp_path / 'study.sqlite'}", repeats=2)
    assert r.status in ("applied", "kept"), r
    assert ed.last_tune is not None and len(ed.last_tune.study.trials) >= 3
    assert ed.current.seconds <= before.seconds
    if r.applied:
        assert "adopted the tuner's best" in r.reason and ed.undo().applied
    assert not (tmp_path / "tuned.sqlite").exists(), "record=False: the tuning database is untouched"
    np.testing.assert_allclose(c.numpy(ed.tree), a_np @ b_np, rtol=1e-4, atol=1e-4)
    ed.close()


def test_action_result_text():
    r = ActionResult("split t0.n by 8", "illegal", False, "it breaks things", seconds=1e-3, default_seconds=2e-3,
                     baseline_seconds=1e-3, gflops=3.0, index=4)
    text = str(r)
    assert text.startswith("[4] split t0.n by 8: ILLEGAL: it breaks things (schedule unchanged)")
    assert "2.00x vs default" in text and "1.00x vs NumPy" in text and "3.00 GFLOP/s" in text
    assert r.speedup_vs_default == pytest.approx(2.0)


def test_import_looptool_does_not_import_ipywidgets():
    code = "import sys, looptool, looptool.notebook; print('ipywidgets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# The terminal fallback ----------------------------------------------------------------------
def test_terminal_commands(editor):
    assert "split FACTOR" in run_command(editor, "help")
    assert run_command(editor, "select t0 n") == "selected stage t0, loop n"
    out = run_command(editor, "split 16")
    assert out.startswith("[1] split t0.n by 16: legal") and "n.1 in 0..16" in out and "<==" in out
    assert run_command(editor, "loops") == "m k n.0 [n.1]"
    assert "legal" in run_command(editor, "vectorize")
    run_command(editor, "select k")
    out = run_command(editor, "parallel")
    assert "ILLEGAL" in out and "(schedule unchanged)" in out
    assert "unknown command" in run_command(editor, "frobnicate")
    assert "error" in run_command(editor, "split")
    assert run_command(editor, "undo").startswith("[")
    assert json.loads(run_command(editor, "json"))["steps"] == [["split", "t0", "n", 16]]
    assert run_command(editor, "quit") is None


def test_terminal_main_reads_stdin():
    script = "select t0 n\nsplit 8\nvectorize\nselect k\nparallel\nhistory\nquit\n"
    out = subprocess.run([sys.executable, "-m", "looptool.notebook", "matmul:16x24x32"], input=script,
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "vectorize t0.n.1: legal" in out.stdout and "cannot be parallel" in out.stdout


# The widget layer -----------------------------------------------------------------------------
def test_widget_editor_headless():
    pytest.importorskip("ipywidgets")
    from looptool.notebook import LoopTreeEditor

    c, a_np, b_np = matmul()
    w = LoopTreeEditor(c, baseline=lambda: a_np @ b_np, repeats=3, budget_seconds=0.02)
    assert w.stage_dropdown.value == "t0" and list(w.loop_dropdown.options) == ["m", "k", "n"]
    assert "for k in 0..40" in w.tree_view.value and "✔ legal" in w.status.value
    assert w.plot.value[:4] == b"\x89PNG"
    assert w.buttons["undo"].disabled

    w.loop_dropdown.value = "n"
    assert w.core.loop == "n" and "background:#ffe08a" in w.tree_view.value
    w.factor.value = 16
    w.buttons["split"].click()
    assert w.results[-1].applied and list(w.loop_dropdown.options) == ["m", "k", "n.0", "n.1"]
    assert w.loop_dropdown.value == "n.1" and not w.buttons["undo"].disabled
    w.buttons["vectorize"].click()
    assert "[vectorize]" in w.tree_view.value

    w.loop_dropdown.value = "k"
    w.buttons["move_out"].click()
    assert list(w.loop_dropdown.options) == ["k", "m", "n.0", "n.1"]
    before = w.core.schedule.to_json()
    w.buttons["parallel"].click()
    assert w.results[-1].status == "illegal" and w.core.schedule.to_json() == before
    assert "✘ illegal" in w.status.value and "cannot be parallel" in w.status.value
    assert "the schedule is unchanged" in w.status.value and "illegal" in w.log.value

    w.buttons["undo"].click()
    assert list(w.loop_dropdown.options) == ["m", "k", "n.0", "n.1"]

    assert w.buffer_dropdown.options == ("in0", "in1") and w.buttons["place"].disabled
    w.buffer_dropdown.value = "in1"
    w.buttons["cache"].click()
    assert w.stage_dropdown.value == "in1.t0" and list(w.consumer_dropdown.options) == ["t0"]
    assert w.depth.max == 4 and not w.buttons["place"].disabled
    w.depth.value = 2
    w.buttons["place"].click()
    assert w.results[-1].applied and w.core.schedule.of("in1.t0").at == 2
    w.stage_dropdown.value = "t0"
    assert list(w.loop_dropdown.options) == ["m", "k", "n.0", "n.1"]
    np.testing.assert_allclose(c.numpy(w.tree), a_np @ b_np, rtol=1e-4, atol=1e-4)

    # programmatic methods refresh the widgets too
    w.select("t0", "m")
    r = w.split(4)          # m is shared with the copy placed inside it: refused, shown in the status
    assert r.status == "refused" and "placed inside it" in w.status.value
    w.select("t0", "n.1")
    r = w.split(8)
    assert r.applied and w.loop_dropdown.value == "n.1.1"
    assert w._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]["model_id"] == w.widget.model_id


def test_widget_editor_softmax_and_export(tmp_path):
    pytest.importorskip("ipywidgets")
    from looptool.notebook import LoopTreeEditor

    t, ref = softmax()
    w = LoopTreeEditor(t, baseline=ref, repeats=2, budget_seconds=0.01)
    w.stage_dropdown.value = "t1"
    assert list(w.consumer_dropdown.options) == ["t2"] and w.depth.max == 2
    w.depth.value = 2
    w.buttons["place"].click()
    assert w.results[-1].status == "illegal" and w.core.schedule.steps == ()
    w.depth.value = 1
    w.buttons["place"].click()
    assert w.results[-1].applied
    w.path.value = str(tmp_path / "softmax_kernel")
    w.buttons["export"].click()
    assert w.results[-1].status == "exported" and (tmp_path / "softmax_kernel" / "manifest.json").exists()
    assert "✔ exported" in w.status.value


# The notebooks ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    """A kernel spec for this interpreter, in a temporary JUPYTER_PATH (nothing written to ~)."""
    pytest.importorskip("nbclient", reason="executing notebooks needs nbclient (pip install 'looptool[test]')")
    pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel (pip install 'looptool[test]')")
    pytest.importorskip("nbformat", reason="executing notebooks needs nbformat")
    pytest.importorskip("ipywidgets", reason="the notebooks need ipywidgets (pip install 'looptool[notebook]')")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "looptool-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "looptool tests", "language": "python",
        "env": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}}))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root)] + ([old] if old else []))
    yield "looptool-test"
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


def test_notebooks_are_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat", reason="reading notebooks needs nbformat")
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_interactive_editor.ipynb",
                                           "03_tuning.ipynb", "04_export_reuse.ipynb"]
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        nbformat.validate(book)
        for cell in book.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_name, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, kernel_name=kernel_name, timeout=240, allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()    # raises CellExecutionError on the first failing cell
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_the_editor_works_on_a_function_with_a_dynamic_dim(rng):
    b = lt.symbols("b", dynamic=True)[0]
    k, n = lt.symbols("k n")

    @lt.function
    def layer(x: lt.In[b, k], w: lt.In[k, n]):
        return (x * w).sum(k)
    x, w = rng.standard_normal((37, 24)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    ed = ScheduleEditor(layer.tensor(x, w), baseline=lambda: x @ w, repeats=2, budget_seconds=0.01)
    assert ed.split(8, "b").applied and ed.parallel("b.0").applied and ed.unroll("b.1").applied
    refused = ed.unroll("b.0")
    assert refused.status == "refused" and "known only at run time" in refused.reason
    assert "for b.0 in 0..ceil(B/8)  [parallel]" in ed.text()
    assert all(r.status != "wrong" for r in ed.results) and ed.results[-2].relative_error < 1e-5
    assert ed.flops == 2 * 37 * 24 * 40                    # at the traced size, not the planned one


# An lt.function in the editor -------------------------------------------------------------------
def traced_matmul():
    m, k, n = lt.symbols("m k n")

    @lt.function
    def matmul(a: lt.In[m, k], b: lt.In[k, n]):
        return (a * b).sum(k)
    return matmul


def test_the_editor_edits_a_function_on_example_arrays():
    """`ScheduleEditor(fn, example=...)`: the function's program for that signature, its loop orders
    changed with the isl verdict and the time after each, named after the function."""
    matmul = traced_matmul()
    a_np, b_np = matmul_inputs()
    ed = ScheduleEditor(matmul, baseline=lambda: a_np @ b_np, example=(a_np, b_np), repeats=2, budget_seconds=0.01)
    assert ed.name == "matmul" and ed.text() == str(matmul.tensor(a_np, b_np).loop_tree())
    assert (ed.stage, ed.loop) == ("t0", "m") and ed.current.relative_error < 1e-5
    moved = ed.move_in("k")
    assert moved.applied and moved.seconds > 0 and moved.default_seconds > 0 and moved.baseline_seconds > 0
    assert moved.relative_error < 1e-5 and ed.loops() == ["m", "n", "k"]
    illegal = ed.parallel("k")
    assert illegal.status == "illegal" and "k" in illegal.reason and ed.loops() == ["m", "n", "k"]
    ed.close()


def matmul_inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((24, 40), dtype=np.float32), rng.standard_normal((40, 48), dtype=np.float32)


def test_the_editor_takes_a_functions_latest_trace():
    matmul = traced_matmul()
    with pytest.raises(ValueError, match=r"ScheduleEditor\(matmul\): no arrays to trace it on; pass "
                                         r"example=\(arrays...\), one per parameter \(a, b\), or call matmul first"):
        ScheduleEditor(matmul, measure=False)
    a_np, b_np = matmul_inputs()
    matmul(a_np[:5], b_np)
    matmul(a_np, b_np)                       # the latest new signature
    ed = ScheduleEditor(matmul, measure=False)
    assert ed.example[0] is a_np and ed.example[1] is b_np and ed.tensor.shape == (24, 48)
    assert np.shares_memory(ed.arrays[0], a_np)
    matmul(a_np[:5], b_np)                   # a signature traced before: no new trace
    assert ScheduleEditor(matmul, measure=False).tensor.shape == (24, 48)
    del ed
    a_copy = a_np.copy()
    matmul(a_copy[:3], b_np)
    del a_copy                               # the function keeps no array alive
    with pytest.raises(ValueError, match="no arrays to trace it on"):
        ScheduleEditor(matmul, measure=False)
    with pytest.raises(TypeError, match="example= is for an lt.function; got a Tensor"):
        ScheduleEditor(matmul.tensor(a_np, b_np), example=(a_np, b_np))


def test_the_editor_exports_a_dynamic_function_by_its_parameters(tmp_path, rng):
    """Export from the editor writes the function's C entry (inputs named after its parameters, the
    dynamic size an argument), which runs the edited schedule at other sizes."""
    b = lt.symbols("b", dynamic=True)[0]
    k, n = lt.symbols("k n")

    @lt.function
    def layer(x: lt.In[b, k], w: lt.In[k, n]):
        return lt.relu((x * w).sum(k))
    x, w = rng.standard_normal((37, 24)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    layer(x, w)
    ed = ScheduleEditor(layer, repeats=2, budget_seconds=0.01)
    assert ed.split(8, "b", stage="t0").applied
    assert "for b.0 in 0..ceil(B/8)" in ed.text()
    result = ed.export(tmp_path / "layer_kernel")
    assert result.status == "exported", result.reason
    loaded = lt.load(tmp_path / "layer_kernel")
    assert [entry["name"] for entry in loaded.inputs] == ["x", "w"]
    for size in (1, 9, 100):
        xs = rng.standard_normal((size, 24)).astype(np.float32)
        got = loaded(x=xs, w=w)
        assert np.abs(got - np.maximum(xs.astype(np.float64) @ w, 0)).max() < 1e-5 * max(1.0, np.abs(got).max())
    manifest = json.loads((tmp_path / "layer_kernel" / "manifest.json").read_text())
    assert manifest["schedule"] == json.loads(ed.schedule.to_json())


def test_the_editor_applies_its_schedule_back_onto_the_function(rng):
    """`ScheduleEditor.use()` (the terminal's `use`): the function's calls of the example's signature run
    the edited schedule from then on; on a tensor it is refused."""
    matmul = traced_matmul()
    a_np, b_np = matmul_inputs()
    ed = ScheduleEditor(matmul, example=(a_np, b_np), measure=False)
    assert ed.split(8, "n").applied and ed.vectorize().applied
    used = ed.use()
    assert used.status == "used" and "matmul's calls of the signature of (24, 40), (40, 48)" in used.reason
    assert "(schedule unchanged)" not in str(used) and not used.applied
    assert matmul.loop_tree(a_np, b_np).schedule.steps == ed.schedule.steps
    other = rng.standard_normal((24, 40)).astype(np.float32)
    got = matmul(other, b_np)
    assert np.abs(got - other.astype(np.float64) @ b_np).max() < 1e-5 * np.abs(other.astype(np.float64) @ b_np).max()
    assert run_command(ed, "undo").startswith("[") and "used" in run_command(ed, "use")
    assert matmul.loop_tree(a_np, b_np).schedule.steps == ed.schedule.steps == (("split", "t0", "n", 8),)
    refused = ScheduleEditor(matmul.tensor(a_np, b_np), measure=False).use()
    assert refused.status == "refused" and "not an lt.function" in refused.reason


def test_terminal_main_edits_a_function_on_example_shapes():
    script = "select t0 n\nsplit 8\nvectorize\nuse\nquit\n"
    command = [sys.executable, "-m", "looptool.notebook", "tests.notebook.example_functions:matmul"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*command, "--example", "16x24", "24x32"], input=script, capture_output=True, text=True,
                         cwd=ROOT, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "looptool schedule editor: matmul" in out.stdout and "in0: f32[16, 24] input" in out.stdout
    assert "vectorize t0.n.1: legal" in out.stdout and "use in matmul: used" in out.stdout
    missing = subprocess.run(command, input="", capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert missing.returncode == 2
    assert "is an lt.function: give the shapes of its example arrays, one per parameter (a, b)" in missing.stderr


def test_the_widget_edits_a_function():
    pytest.importorskip("ipywidgets")
    from looptool.notebook import LoopTreeEditor
    matmul = traced_matmul()
    a_np, b_np = matmul_inputs()
    w = LoopTreeEditor(matmul, example=(a_np, b_np), repeats=2, budget_seconds=0.01)
    assert "matmul" in w.title.value and "for k in 0..40" in w.tree_view.value
    w.move_in("k")
    assert w.core.loops() == ["m", "n", "k"] and w.results[-1].applied
    w.buttons["use"].click()
    assert "✔ used" in w.status.value and matmul.loop_tree(a_np, b_np).schedule.steps == w.core.schedule.steps
