"""The shape the code keeps: no import cycles among tfdist modules, a generic
Trainer whose `fit` loops over epochs and hands executions to the epoch
loop, and modules that are split when they grow past ~400 lines (split,
never compressed: a module near the limit is a module to split).

Read from the source with `ast` (module-level imports only; imports inside
functions are deliberate late imports and listed where allowed).
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfdist"
MAX_LINES = 400
# Modules that know one strategy family; the generic loop must not import them.
STRATEGY_SPECIFIC = {
    "tfdist.strategies.multi_worker", "tfdist.strategies.parameter_server", "tfdist.cluster.peers",
    "tfdist.loops.runners.coordinator", "tfdist.loops.runners.per_worker", "tfdist.strategies.local_devices",
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _top_level_imports(path: pathlib.Path, modules) -> set:
    """tfdist modules imported at module level (not inside functions)."""
    tree = ast.parse(path.read_text())
    found = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    found.discard(_module_name(path))
    return found


def _graph():
    modules = _modules()
    return {name: _top_level_imports(path, modules) for name, path in modules.items()}


def _cycle_from(graph, start):
    stack = [(start, [start])]
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return path + [start]
            if nxt not in path and len(path) < len(graph):
                stack.append((nxt, path + [nxt]))
    return None


def test_the_import_graph_finds_imports():
    graph = _graph()
    # A checker that sees no edges would pass any code: pin known ones.
    assert "tfdist.strategies.multi_worker" in graph["tfdist.strategies.registry"]
    assert "tfdist.loops.runners" in graph["tfdist.training.trainer"]


def test_no_import_cycle_among_tfdist_modules():
    graph = _graph()
    # Packages import their submodules; a submodule importing its package
    # (`from tfdist import x`) is not a cycle through the package's code
    # unless the package imports it back, which the graph shows.
    cycles = [c for c in (_cycle_from(graph, name) for name in graph) if c]
    assert not cycles, f"import cycles: {cycles}"


def test_trainer_imports_no_strategy_specific_module():
    imported = _graph()["tfdist.training.trainer"]
    assert not imported & STRATEGY_SPECIFIC, imported & STRATEGY_SPECIFIC


def test_only_the_package_imports_the_trainer():
    importers = []
    for path in _modules().values():
        source = path.read_text()
        if path.name != "__init__.py" or path.parent != PACKAGE:
            if "tfdist.training.trainer" in source or "from tfdist.training import trainer" in source:
                importers.append(str(path))
    # tfdist/__init__.py names it for lazy loading; keras_fit.py (tfdist.attach)
    # is the one layer above the Trainer; nothing else may.
    allowed = ("tfdist/training/trainer.py", "tfdist/training/keras_fit.py")
    assert not [p for p in importers if not p.endswith(allowed)], importers


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_is_at_most_400_lines(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by job (never compress it)"


def test_trainer_fit_reads_like_a_controller():
    """``fit`` loops over epochs only; executions are the epoch loop's
    (`tfdist.training.epoch_loop`: one loop over the cadence's plans, one
    runner call per plan), and the Trainer has no loop of its own."""
    tree = ast.parse((PACKAGE / "training" / "trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    fit = next(n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == "fit")
    loops = [n for n in ast.walk(trainer) if isinstance(n, (ast.For, ast.While))]
    assert [loop for loop in loops if loop not in list(ast.walk(fit))] == [], \
        "a loop in a Trainer method other than fit: executions belong to EpochLoop"
    assert len(loops) == 1 and isinstance(loops[0], ast.For), "fit loops over epochs, once"
    epoch_loop = ast.parse((PACKAGE / "training" / "epoch_loop.py").read_text())
    train_calls = [n for n in ast.walk(epoch_loop) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and n.func.attr == "train"]
    assert len(train_calls) == 1, "one runner call per plan, for every path"


def test_cadence_is_pure_python():
    tree = ast.parse((PACKAGE / "loops" / "cadence.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"dataclasses", "typing"}, imported


# Packages from the ground up (docs/architecture.md): a module-level import
# between two of them points down this list, never up.
LAYERS = ["errors", "_internal", "cluster", "strategies", "data", "replica", "communication",
          "checkpoint", "tpu", "loops", "training", "launch", "integrations"]


def _layer(module: str):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _upward_imports(graph):
    upward = []
    for module, imported in graph.items():
        here = _layer(module)
        for name in imported:
            there = _layer(name)
            if here and there and here != there and LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{module} -> {name}")
    return sorted(upward)


def test_every_package_is_listed_in_the_layer_order():
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")} | {"errors"}
    assert packages == set(LAYERS), packages ^ set(LAYERS)


def test_nothing_imports_upward():
    assert _upward_imports(_graph()) == []


def test_the_layer_check_sees_an_upward_import():
    """The check itself: an import from the ground floor up is found."""
    graph = {"tfdist._internal.x": {"tfdist.training.trainer", "tfdist.errors"}}
    assert _upward_imports(graph) == ["tfdist._internal.x -> tfdist.training.trainer"]


def test_only_internal_keras_reaches_into_keras_src():
    """Every import of ``keras.src`` (module level or in a function) is in
    `tfdist/_internal/keras/`, one module per job."""
    found = []
    for name, path in _modules().items():
        if name.startswith("tfdist._internal.keras"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{name}: {n}" for n in names if n.startswith("keras.src")]
    assert found == []


def test_the_tests_mirror_the_package():
    """Each test folder is a tfdist package, or one of the four shared ones."""
    tests = pathlib.Path(__file__).resolve().parent
    folders = {path.name for path in tests.iterdir()
               if path.is_dir() and not path.name.startswith((".", "__"))}
    shared = {"scenarios", "conformance", "support", "programs"}
    assert folders - shared <= set(LAYERS), folders - shared - set(LAYERS)
    assert not list(tests.glob("support/test_*.py")) and not list(tests.glob("programs/test_*.py"))
