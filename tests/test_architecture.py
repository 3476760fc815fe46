"""The shape the code keeps: no import cycles among tfdist modules, a generic
Trainer whose `fit` loops over epochs and hands executions to the epoch
loop, modules that are split when they grow past ~400 lines (split,
never compressed: a module near the limit is a module to split), and
Keras' internals reached in `tfdist/_internal/keras/` only.

Read from the source with `ast` (module-level imports only; imports inside
functions are deliberate late imports and listed where allowed).
"""

import ast
import functools
import importlib.util
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
          "parallel", "checkpoint", "tpu", "loops", "training", "launch", "integrations"]


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


_TENSORFLOW_INTERNALS = ("tensorflow.python", "tensorflow.core", "tensorflow.compiler")


def _tensorflow_internals_in(source: str) -> set:
    """The TensorFlow internal modules ``source`` imports (module level or
    in a function, ``from tensorflow.python.x import y`` as
    ``tensorflow.python.x.y`` and ``tensorflow.python.x``) or names in a
    string (a module looked up in ``sys.modules``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return {name for name in found if name.startswith(_TENSORFLOW_INTERNALS)}


def _listed_tensorflow_internals() -> set:
    spec = importlib.util.spec_from_file_location(
        "tensorflow_privates", PACKAGE / "_internal" / "tensorflow" / "privates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return set(module.modules())


def test_every_tensorflow_internal_tfdist_imports_is_pinned():
    """Each TensorFlow internal module tfdist imports is listed in
    `tfdist._internal.tensorflow.privates`, which the TensorFlow contract
    test checks entry by entry: no import of one goes unpinned."""
    listed = _listed_tensorflow_internals()
    unlisted = []
    for name, path in _modules().items():
        if name == "tfdist._internal.tensorflow.privates":
            continue
        for module in sorted(_tensorflow_internals_in(path.read_text())):
            # (``from package import module``: the module, or the package, is listed)
            if module not in listed and not any(m.startswith(module + ".") for m in listed) \
                    and module.rsplit(".", 1)[0] not in listed:
                unlisted.append(f"{name}: {module}")
    assert unlisted == [], (
        "list these in tfdist/_internal/tensorflow/privates.py (what is read, and by whom):")


def _tensorflow_reaches_in(source: str, attributes) -> list:
    """(line, code) of each import of a TensorFlow internal in ``source``,
    and each ``x.name`` with ``name`` among ``attributes`` (TensorFlow's
    private attributes tfdist reads) on anything but ``self`` (tfdist's own
    attributes may share a name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _tensorflow_internals_in(
                ast.unparse(node)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Attribute) and node.attr in attributes and not (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in attributes):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def _tensorflow_private_attributes() -> dict:
    spec = importlib.util.spec_from_file_location(
        "tensorflow_privates", PACKAGE / "_internal" / "tensorflow" / "privates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ATTRIBUTES


def test_tensorflow_internals_are_reached_in_internal_only():
    """No module above the ground floor (`tfdist/_internal/`) imports a
    TensorFlow internal or reaches a private attribute of a TensorFlow
    object that tfdist reads (`privates.ATTRIBUTES`): each is behind a
    named function in `tfdist/_internal/tensorflow/`."""
    attributes = _tensorflow_private_attributes()
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {code[:80]}"
             for name, path in _modules().items() if not name.startswith("tfdist._internal")
             for line, code in _tensorflow_reaches_in(path.read_text(), attributes)]
    assert found == [], ("move these behind a named function in tfdist/_internal/tensorflow/ "
                         "(and list them in its privates.py):\n" + "\n".join(found))


def test_the_tensorflow_reaches_check_sees_them():
    source = ("from tensorflow.python.ops import gen_math_ops\n"
              "def f(self, coordinator):\n"
              "    self._saver = coordinator._cluster\n"
              "    return getattr(coordinator, '_saver', None)\n")
    assert [line for line, _ in _tensorflow_reaches_in(source, {"_cluster", "_saver"})] == [
        1, 3, 4]


def test_the_tensorflow_internals_check_sees_them():
    source = "from tensorflow.python.ops import gen_math_ops\nX = 'tensorflow.core.foo'\n"
    assert _tensorflow_internals_in(source) == {
        "tensorflow.python.ops", "tensorflow.python.ops.gen_math_ops", "tensorflow.core.foo"}


def test_the_tests_mirror_the_package():
    """Each test folder is a tfdist package, or one of the four shared ones."""
    tests = pathlib.Path(__file__).resolve().parent
    folders = {path.name for path in tests.iterdir()
               if path.is_dir() and not path.name.startswith((".", "__"))}
    shared = {"scenarios", "conformance", "support", "programs"}
    assert folders - shared <= set(LAYERS), folders - shared - set(LAYERS)
    assert not list(tests.glob("support/test_*.py")) and not list(tests.glob("programs/test_*.py"))


# Keras internals in one room: a private Keras attribute is read, and a
# Keras function or method replaced, in `tfdist/_internal/keras/` only,
# behind a named function that tests/_internal/test_keras_contract.py pins.
KERAS_ROOM = "tfdist._internal.keras"
# TensorFlow's checkpoint protocol (a TensorFlow private, not Keras'; out of scope).
TF_CHECKPOINT_PROTOCOL = {"_serialize_to_tensors", "_restore_from_tensors",
                          "_copy_trackable_to_cpu"}
# Privates tfdist relies on: the derived set must keep them (an exclusion
# below that swallowed one would blind the check to it).
RELIED_ON = {"_var_key", "_trainable_variables_indices", "_backend_update_step",
             "_trackable_children", "_learning_rate", "_value", "_all_reduce_sum_gradients",
             "_trainable_variables", "_clip_gradients", "_flatten_layers", "_symbolic_build",
             "_seed_generators", "_maybe_autocast", "_direct_assign"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_defined(tree) -> set:
    """Names a source assigns as ``self._x`` / ``cls._x``, and its private
    classes and functions (in classes and at module level)."""
    found = set()
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        found.update(sub.attr for target in targets for sub in ast.walk(target)
                     if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                     and sub.value.id in ("self", "cls") and _private(sub.attr))
    bodies = [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in bodies + [tree.body]:
        found.update(n.name for n in body if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(n.name))
    return found


def _keras_package() -> pathlib.Path:
    return pathlib.Path(importlib.util.find_spec("keras").submodule_search_locations[0])


@functools.lru_cache(maxsize=None)
def _keras_privates() -> frozenset:
    """Keras' private names, from the installed source (its tests
    skipped), less TensorFlow's checkpoint protocol. tfdist's own private
    attributes of the same names are told apart by their receiver
    (`_own_receiver`), not by leaving the names out."""
    keras_names = set()
    for path in (_keras_package() / "src").rglob("*.py"):
        if not (path.name.endswith("_test.py") or {"tests", "testing"} & set(path.parts)):
            keras_names |= _private_names_defined(ast.parse(path.read_text()))
    return frozenset(keras_names - TF_CHECKPOINT_PROTOCOL)


@functools.lru_cache(maxsize=None)
def _keras_public_classes() -> frozenset:
    """The public ``keras.optimizers`` and ``keras.layers`` class names."""
    names = set()
    for package in ("optimizers", "layers"):
        tree = ast.parse((_keras_package() / package / "__init__.py").read_text())
        names.update(alias.asname or alias.name for node in tree.body
                     if isinstance(node, ast.ImportFrom) for alias in node.names
                     if (alias.asname or alias.name)[:1].isupper())
    return frozenset(names)


def _own_receiver(node: ast.Attribute, parents: dict) -> bool:
    """``self._x`` / ``cls._x`` where ``self`` is a parameter of a method
    of a tfdist class (a function outside any class that takes ``self`` is
    installed on a Keras class: its ``self`` is a Keras object)."""
    if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
        return False
    scope = parents.get(node)
    while scope is not None:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
            if node.value.id in [a.arg for a in arguments]:
                return isinstance(parents.get(scope), ast.ClassDef)
        scope = parents.get(scope)
    return False


def _set_or_removed(node: ast.Call, constants: dict):
    """For ``object.__setattr__(o, name, ...)``, ``object.__delattr__(o,
    name)`` and ``o.__dict__.pop(name)``: ``name`` (a string, or a module
    constant's value; "" when neither); else None."""
    func, argument = node.func, None
    if not isinstance(func, ast.Attribute):
        return None
    if (func.attr in ("__setattr__", "__delattr__") and isinstance(func.value, ast.Name)
            and func.value.id == "object" and len(node.args) >= 2):
        argument = node.args[1]
    elif func.attr == "pop" and isinstance(func.value, ast.Attribute) \
            and func.value.attr == "__dict__" and node.args:
        argument = node.args[0]
    else:
        return None
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value
    return constants.get(argument.id, "") if isinstance(argument, ast.Name) else ""


def _keras_internals_in(source: str, privates, classes) -> list:
    """``(line, rule, code)`` for each reach into Keras' internals: (R1) a
    private Keras attribute not on a tfdist method's ``self``, (R2) a
    string naming one (docstrings aside), (R3) an attribute set or removed
    past Keras' tracking that is not a ``_tfdist_*`` marker, (R4) Keras
    optimizer or layer classes listed by name."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, documented) and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in privates \
                and not _own_receiver(node, parents):
            found.append((node.lineno, "R1 a private Keras attribute", ast.unparse(node)))
        elif isinstance(node, ast.Constant) and node.value in privates \
                and id(node) not in docstrings:
            found.append((node.lineno, "R2 a string naming a private Keras attribute",
                          repr(node.value)))
        elif isinstance(node, ast.Call):
            name = _set_or_removed(node, constants)
            if name is not None and not (name.startswith("_tfdist_")
                                         or name in TF_CHECKPOINT_PROTOCOL):
                found.append((node.lineno, "R3 a method set or removed past Keras' tracking",
                              ast.unparse(node)))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and e.value in classes for e in node.elts):
            found.append((node.lineno, "R4 Keras classes matched by name", ast.unparse(node)))
    return sorted(found)


def test_the_keras_private_names_are_read_from_keras():
    privates = _keras_privates()
    assert RELIED_ON <= privates, sorted(RELIED_ON - privates)
    assert not privates & TF_CHECKPOINT_PROTOCOL
    assert {"SGD", "Adam", "AdamW", "Lion", "Dense", "Embedding"} <= _keras_public_classes()


def test_keras_internals_are_reached_in_internal_keras_only():
    """Every private Keras attribute read (R1, R2), Keras method replaced on
    an object (R3) and Keras class matched by its name (R4) is in
    `tfdist/_internal/keras/`, behind a named function."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {rule}: {code[:80]}"
             for name, path in _modules().items() if not name.startswith(KERAS_ROOM)
             for line, rule, code in _keras_internals_in(
                 path.read_text(), _keras_privates(), _keras_public_classes())]
    assert found == [], ("move these behind a named function in tfdist/_internal/keras/ "
                         "(and pin it in tests/_internal/test_keras_contract.py):\n"
                         + "\n".join(found))


KERAS_REACHES = '''\
ELEMENTWISE = ("SGD", "Adam")
def f(optimizer, o, m, v, f):
    optimizer._var_key(v)
    getattr(o, "_learning_rate")
    object.__setattr__(m, "fit", f)
    m.__dict__.pop("fit")
    object.__setattr__(m, "_tfdist_marker", 1)
def installed_on_a_keras_class(self, value):
    return self._value
class Own:
    def __init__(self):
        "_value"
        self._layout = 1
        self.read = lambda: self._layout
'''


def test_the_keras_internals_check_sees_them():
    """The check itself: each rule flags its reach; tfdist's own private
    attributes on ``self``, markers and docstrings pass."""
    found = _keras_internals_in(KERAS_REACHES, _keras_privates() | {"_layout"},
                                _keras_public_classes())
    assert [(line, rule[:2]) for line, rule, _ in found] == [
        (1, "R4"), (3, "R1"), (4, "R2"), (5, "R3"), (6, "R3"), (9, "R1")], found
