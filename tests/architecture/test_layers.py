"""The architecture, enforced: layers import only downward, no import circles (lazy imports
included), no private names across modules.  Written with the standard library's `ast`, so
it reads the source as a reader does: every import statement counts, wherever it stands."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("looptool", "tuner")
CHECKED_FOR_PRIVATE_NAMES = ("looptool", "tuner", "bench")

# Bottom-up: a module may import modules of its own layer or of layers below it.
LAYERS = (
    ("looptool.errors", "looptool.hooks", "looptool.memo", "looptool.version"),
    ("looptool.frontend",),
    ("looptool.ir",),
    ("looptool.schedule",),
    ("looptool.analysis",),
    ("looptool.autoschedule",),
    ("looptool.codegen",),
    ("looptool.runtime",),
    ("looptool.export",),
    ("looptool",),                 # the package's __init__ alone: the public API
    ("tuner",),
    ("looptool.notebook",),
    ("looptool.__main__",),        # the command line: demo, tune, export, run
)
ROOTS_MATCHED_EXACTLY = ("looptool",)   # a new looptool module must be given its layer


def module_files(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under the given packages."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_nodes(tree: ast.AST):
    """Every import statement, at module level or inside functions, except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _base_module(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imported_modules(name: str, path: Path, known: dict[str, Path]):
    """(imported module, imported names) for each import of one of `known` in the module `name`:
    `from X import y` counts as importing X.y where that is a module, else X."""
    tree = ast.parse(path.read_text(), str(path))
    for node in import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known or alias.name.split(".")[0] in PACKAGES:
                    yield alias.name, ()
            continue
        base = _base_module(name, path, node)
        if base.split(".")[0] not in PACKAGES:
            continue
        plain = []
        for alias in node.names:
            if f"{base}.{alias.name}" in known:
                yield f"{base}.{alias.name}", ()
            else:
                plain.append(alias.name)
        if plain:
            yield base, tuple(plain)


def import_graph(root: Path, packages=PACKAGES) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> modules it imports (within `packages`), and every private name imported across modules."""
    known = module_files(root, packages)
    graph, private = {}, []
    for name, path in known.items():
        graph[name] = set()
        for target, names in imported_modules(name, path, known):
            if target != name:
                graph[name].add(target)
            private += [f"{name} imports {n} from {target}" for n in names
                        if n.startswith("_") and not n.startswith("__") and target != name]
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    """The index in LAYERS of the most specific layer prefix naming this module."""
    best, best_len = None, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            below = module.startswith(prefix + ".") and prefix not in ROOTS_MATCHED_EXACTLY
            if (module == prefix or below) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    if best is None:
        raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS in {Path(__file__).name}")
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a higher layer than the importer's."""
    return [f"{src} (layer {layer_of(src)}: {LAYERS[layer_of(src)][0]}) imports {dst} "
            f"(layer {layer_of(dst)}: {LAYERS[layer_of(dst)][0]})"
            for src in sorted(graph) for dst in sorted(graph[src] & graph.keys()) if layer_of(dst) > layer_of(src)]


def private_attribute_uses(root: Path, packages) -> list[str]:
    """`module._name` where `module` was imported from one of our packages under another name."""
    found = []
    known = module_files(root, PACKAGES)
    for name, path in module_files(root, packages).items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in import_nodes(tree):
            for alias in node.names:
                if isinstance(node, ast.ImportFrom):
                    target = f"{_base_module(name, path, node)}.{alias.name}"
                else:
                    target = alias.name
                if target in known and target != name:
                    aliases[alias.asname or alias.name.split(".")[0]] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return found


# The project -------------------------------------------------------------------------------------

def test_no_import_cycles():
    graph, _ = import_graph(REPO)
    assert cycles(graph) == [], "import circles (lazy imports count too)"


def test_layers_import_only_downward():
    graph, _ = import_graph(REPO)
    assert upward_imports(graph) == []


def test_no_private_names_imported_across_modules():
    _, private = import_graph(REPO, CHECKED_FOR_PRIVATE_NAMES)
    assert private == []


def test_no_private_attributes_of_other_modules():
    assert private_attribute_uses(REPO, CHECKED_FOR_PRIVATE_NAMES) == []


def test_every_module_has_a_layer():
    graph, _ = import_graph(REPO)
    for module in graph:
        layer_of(module)


# The checker itself can fail ---------------------------------------------------------------------

def _write(root: Path, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_a_lazy_import_circle(tmp_path):
    _write(tmp_path, {
        "looptool/__init__.py": "",
        "looptool/ir/__init__.py": "from .program import Program\n",
        "looptool/ir/program.py": "Program = object\n",
        "looptool/schedule/__init__.py": "",
        "looptool/schedule/looptree.py": "from .. import ir\n\ndef check():\n    from ..analysis import legality\n",
        "looptool/analysis/__init__.py": "",
        "looptool/analysis/legality.py": "from ..schedule.looptree import check\n",
    })
    graph, _ = import_graph(tmp_path)
    assert cycles(graph) == [["looptool.analysis.legality", "looptool.schedule.looptree"]]
    assert upward_imports(graph) == [
        "looptool.schedule.looptree (layer 3: looptool.schedule) imports looptool.analysis.legality "
        "(layer 4: looptool.analysis)"]


def test_checker_finds_private_imports_and_attributes(tmp_path):
    _write(tmp_path, {
        "looptool/__init__.py": "",
        "looptool/codegen/__init__.py": "",
        "looptool/codegen/cpu.py": "_FunctionBuilder = object\n",
        "looptool/codegen/gpu.py": "from .cpu import _FunctionBuilder\nfrom . import cpu\nx = cpu._FunctionBuilder\n",
    })
    _, private = import_graph(tmp_path)
    assert private == ["looptool.codegen.gpu imports _FunctionBuilder from looptool.codegen.cpu"]
    assert private_attribute_uses(tmp_path, ("looptool",)) == [
        "looptool.codegen.gpu:3 uses looptool.codegen.cpu._FunctionBuilder"]


def test_type_checking_imports_do_not_count(tmp_path):
    _write(tmp_path, {
        "looptool/__init__.py": "",
        "looptool/ir/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..schedule import x\n",
        "looptool/schedule/__init__.py": "from .. import ir\nx = 1\n",
    })
    graph, _ = import_graph(tmp_path)
    assert graph["looptool.ir"] == set() and graph["looptool.schedule"] == {"looptool.ir"}


def test_module_outside_every_layer_is_named():
    with pytest.raises(AssertionError, match="looptool_extra.mod belongs to no layer"):
        layer_of("looptool_extra.mod")
