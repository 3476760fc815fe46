"""Pins the Keras internals tfdist reads (tfdist/_internal/keras/, one module per job).

If a Keras upgrade changes them, this fails first, with a clear name. It
collects on any Keras: every private tfdist reads by name is one test
(`test_private_is_where_tfdist_reads_it`, from
`tfdist._internal.keras.privates`, read without importing tfdist), and on a
Keras that tfdist refuses to load, each behaviour test fails with tfdist's
own error instead of the file failing to collect.
"""

import functools
import importlib.util
import inspect
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf


def _privates_module():
    """`tfdist._internal.keras.privates` from its file: importing it as a
    package module would load tfdist's Keras room, which refuses a Keras
    whose internals moved (the case this file must still report on)."""
    package = pathlib.Path(importlib.util.find_spec("tfdist").submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location(
        "keras_contract_privates", package / "_internal" / "keras" / "privates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


privates = _privates_module()
try:
    from tfdist._internal.keras import compiled as keras_compiled, model_state as keras_model_state
    from tfdist._internal.keras import optimizer as keras_optimizer, patches, sliced_weights
    from tfdist._internal.keras import layer_calls, layer_units
    ROOM_ERROR = None
except ImportError as error:  # (tfdist.errors.UnsupportedKerasError is one)
    ROOM_ERROR = error


@pytest.fixture(autouse=True)
def _tfdist_loads_on_this_keras(request):
    if ROOM_ERROR is not None and request.node.originalname != "test_private_is_where_tfdist_reads_it":
        pytest.fail(f"tfdist does not load on Keras {keras.__version__}: "
                    f"{type(ROOM_ERROR).__name__}: {ROOM_ERROR}", pytrace=False)


@pytest.mark.parametrize("private", privates.PRIVATES, ids=lambda private: private.name)
def test_private_is_where_tfdist_reads_it(private):
    try:
        private.find()
    except (ImportError, AttributeError) as error:
        pytest.fail(f"Keras {keras.__version__} moved or removed {private.name}, which "
                    f"tfdist._internal.keras.{private.user} reads: {type(error).__name__}: "
                    f"{error}", pytrace=False)


_REFUSED = r"""
import importlib, sys
module = importlib.import_module(sys.argv[1])
delattr(module, sys.argv[2])           # as a Keras that moved it
import tfdist
try:
    tfdist.attach
except tfdist.errors.UnsupportedKerasError as error:
    print("REFUSED", error)
"""


def test_a_keras_whose_internals_moved_is_refused_naming_each_one():
    """One error at load, naming the Keras version, each moved private with
    the tfdist module that reads it, and the supported range: never an
    AttributeError from inside a module."""
    nn = privates.tensorflow_ops("nn").__name__
    result = subprocess.run([sys.executable, "-c", _REFUSED, nn, "_compute_moments"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert out.startswith("REFUSED tfdist cannot run on Keras " + keras.__version__), out
    assert f"{nn}._compute_moments (read by tfdist._internal.keras.batch_statistics)" in out, out
    assert "tfdist supports Keras 3.15, 3.16" in out and out.count("\n  - ") == 1, out
    assert "AttributeError" in out  # (the reason each private is missing)


_VERSIONED = r"""
import sys, warnings
import keras
keras.__version__ = sys.argv[1]        # as that Keras would say
import tfdist
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        tfdist.attach
        print("LOADED", [str(w.message) for w in caught if "tested with Keras" in str(w.message)])
    except tfdist.errors.UnsupportedKerasError as error:
        print("REFUSED", error)
"""


@pytest.mark.parametrize("version,outcome", [
    ("3.14.1", "REFUSED tfdist needs Keras 3.15 or newer"),
    ("3.17.0", "LOADED ['tfdist was tested with Keras 3.15, 3.16, not 3.17.0")])
def test_an_older_keras_is_refused_and_a_newer_one_with_every_private_warns(version, outcome):
    result = subprocess.run([sys.executable, "-c", _VERSIONED, version],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(outcome), result.stdout


def test_compiled_model_exposes_what_tfdist_reads():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    keras_model_state.build_model_state(
        model, (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 2], tf.float32))
    )
    (path, loss_fn, weight, _), = keras_compiled.flat_losses(model)
    assert path == () and weight is None
    assert loss_fn.reduction == "sum_over_batch_size"
    assert loss_fn.call(tf.zeros([4, 2]), tf.ones([4, 2])).shape == (4,)
    assert "mae" in keras_compiled.compile_metrics(model).result()
    assert model.optimizer.built


def test_compile_identity_changes_when_the_model_is_compiled_again():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    first = keras_compiled.compile_identity(model)
    assert keras_compiled.compile_identity(model) == first
    model.compile(optimizer=model.optimizer, loss="mse", metrics=["mae"])
    assert keras_compiled.compile_identity(model) != first


def test_all_layers_finds_nested_layers():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="inner_dense")],
                             name="inner")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(inner(inputs)))
    names = {layer.name for layer in keras_model_state.all_layers(model)}
    assert {"inner", "inner_dense", "head"} <= names and model.name not in names


def test_metric_variables_sum_across_replicas_on_read():
    metric = keras.metrics.Mean()
    tf_variable = metric.variables[0].value
    assert tf_variable.synchronization == tf.VariableSynchronization.ON_READ
    assert tf_variable.aggregation == tf.VariableAggregation.SUM


def test_importing_tfdist_patches_nothing_in_keras():
    # Every tfdist module imported; Keras' functions must still be Keras' own.
    code = (
        "import pkgutil, importlib, tfdist\n"
        "skip = ('tfdist.integrations', 'tfdist.__main__', 'tfdist.launch.__main__')\n"
        "for m in pkgutil.walk_packages(tfdist.__path__, 'tfdist.'):\n"
        "    if not m.name.startswith(skip):\n"
        "        importlib.import_module(m.name)\n"
        "from tfdist._internal.keras import privates\n"
        "from keras.src.backend.tensorflow import optimizer\n"
        "nn = privates.tensorflow_ops('nn')\n"
        "from keras.src.losses import loss\n"
        "import keras\n"
        "patched = [f.__qualname__ for f in (nn._compute_moments, nn._compute_moments_sync,\n"
        "           loss.scale_loss_for_distribution, loss.unscale_loss_for_distribution,\n"
        "           optimizer.TFOptimizer._all_reduce_sum_gradients,\n"
        "           keras.layers.Layer.trainable_weights.fget, keras.layers.Embedding.call)\n"
        "           if not f.__module__.startswith('keras') or hasattr(f, '__wrapped__')]\n"
        "print(patched)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_every_keras_function_tfdist_wraps_is_where_it_looks():
    """`tfdist._internal.keras.patches` finds these (without changing them)."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow import optimizer as tf_optimizer, random as tf_random
    Variable = privates.tensorflow_ops("core").Variable  # pylint: disable=invalid-name
    from keras.src.losses import loss as loss_module
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    from tfdist._internal.keras import patches

    assert callable(loss_module.scale_loss_for_distribution)
    assert callable(loss_module.unscale_loss_for_distribution)
    assert callable(getattr(tf_optimizer.TFOptimizer, patches.GRADIENT_ALL_REDUCE))
    assert patches.has_gradient_all_reduce(keras.optimizers.SGD())
    assert callable(tf_random.draw_seed) and callable(in_stateless_scope)
    assert callable(LossScaleOptimizer.apply)
    assert callable(Variable.assign_add) and callable(Variable.assign_sub)
    inner = keras.optimizers.SGD()
    assert patches.inner_optimizer(keras.optimizers.LossScaleOptimizer(inner)) is inner
    for name in patches.TRAINABLE_LISTS:  # (`step_weights`: the class's properties)
        assert isinstance(vars(keras.layers.Layer).get(name), property), name
        assert all(name not in vars(cls) for cls in (keras.Model, keras.Sequential)), name


def test_file_writing_callbacks_have_the_paths_tfdist_redirects(tmp_path):
    """`tfdist._internal.keras.callback_files`: BackupAndRestore's four file
    paths and its loader, TensorBoard's directories recomputed by set_model."""
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    for name in ("_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path"):
        assert getattr(backup, name).startswith(str(tmp_path / "backup")), name
    assert callable(backup._load_model)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    board = keras.callbacks.TensorBoard(str(tmp_path / "a"))
    board.set_model(model)
    board.log_dir = str(tmp_path / "b")
    board.set_model(model)
    assert board._train_dir == str(tmp_path / "b" / "train")
    assert keras.callbacks.CSVLogger(str(tmp_path / "log.csv")).csv_file is None


# The privates behind tfdist/_internal/keras/{optimizer,patches,model_state}:
# one test each, failing with the private and the function to update.

def _changed(private: str, where: str) -> str:
    return (f"Keras {keras.__version__} changed {private}: tfdist/_internal/keras/{where} "
            "needs updating")


def _parameters(function) -> list:
    return list(inspect.signature(function).parameters)


def _weights():
    return [keras.Variable(np.ones([3], "float32"), name="a"),
            keras.Variable(np.ones([2, 2], "float32"), name="b")]


def test_var_key_is_one_key_per_weight_across_its_forms():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    message = _changed("TFOptimizer._var_key", "optimizer.variable_key")
    assert _parameters(TFOptimizer._var_key) == ["self", "variable"], message
    optimizer, (a, b) = keras.optimizers.SGD(), _weights()
    key = keras_optimizer.variable_key(optimizer, a)
    assert key == keras_optimizer.variable_key(optimizer, a.value), message
    assert key != keras_optimizer.variable_key(optimizer, b), message
    hash(key)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = keras.Variable(np.ones([3], "float32"))
    wanted = keras_optimizer.variable_key(optimizer, mirrored)
    assert [keras_optimizer.variable_key(optimizer, component) for component in
            strategy.experimental_local_results(mirrored.value)] == [wanted, wanted], message


def test_trainable_variables_indices_file_each_weight_by_key():
    message = _changed("BaseOptimizer._trainable_variables_indices", "optimizer.state_index")
    optimizer, (a, b) = keras.optimizers.Adam(), _weights()
    optimizer.build([a, b])
    assert [keras_optimizer.state_index(optimizer, v) for v in (a, b)] == [0, 1], message
    stand_in = keras.Variable(np.ones([3], "float32"))
    keras_optimizer.set_state_index(optimizer, stand_in, 1)
    assert keras_optimizer.state_index(optimizer, stand_in) == 1, message
    # Keras' apply accepts a variable filed so (sharded state's slices).
    optimizer._check_variables_are_known([stand_in])  # pylint: disable=protected-access
    # AdamW decays a variable filed so as the weight it stands for.
    decaying = keras.optimizers.AdamW(0.5, weight_decay=0.1)
    decaying.exclude_from_weight_decay(var_names=["b"])
    decaying.build([a, b])
    for index, expected in ((0, 0.95), (1, 1.0)):
        stand_in = keras.Variable(np.ones([2], "float32"), name="stand_in")
        keras_optimizer.set_state_index(decaying, stand_in, index)
        decaying._apply_weight_decay([stand_in])  # pylint: disable=protected-access
        np.testing.assert_allclose(stand_in.numpy(), [expected] * 2, err_msg=message)


def test_backend_update_step_is_the_update_apply_calls():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    message = _changed("TFOptimizer._backend_update_step", "patches.replace_update_of")
    assert _parameters(TFOptimizer._backend_update_step) == [
        "self", "grads", "trainable_variables", "learning_rate"], message
    optimizer, weights = keras.optimizers.SGD(0.5), _weights()
    optimizer.build(weights)
    calls = []
    patches.replace_update_of(optimizer, lambda *args: calls.append(args))
    optimizer.apply([tf.ones_like(w) for w in weights], weights)
    assert len(calls) == 1 and len(calls[0]) == 3, message
    grads, variables, rate = calls[0]
    assert len(grads) == len(variables) == 2 and float(rate) == 0.5, message
    assert [float(w.numpy().sum()) for w in weights] == [3.0, 4.0], message  # (not Keras')


def test_apply_weight_decay_is_the_decay_apply_calls():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    message = _changed("TFOptimizer._apply_weight_decay", "patches.replace_weight_decay_of")
    assert _parameters(TFOptimizer._apply_weight_decay) == ["self", "variables"], message
    optimizer, weights = keras.optimizers.AdamW(0.5, weight_decay=0.1), _weights()
    optimizer.build(weights)
    decay = patches.weight_decay_of(optimizer)
    calls = []

    def recorded(variables):
        calls.append(list(variables))
        decay(variables)

    patches.replace_weight_decay_of(optimizer, recorded)
    before = [w.numpy().copy() for w in weights]
    optimizer.apply([tf.zeros_like(w) for w in weights], weights)
    assert [len(c) for c in calls] == [2], message
    # Zero gradients: the decay alone moved the weights (1 - 0.5 * 0.1).
    for weight, old in zip(weights, before):
        np.testing.assert_allclose(weight.numpy(), old * 0.95, rtol=1e-6, err_msg=message)


def test_clip_gradients_is_the_clipping_apply_calls_before_its_update():
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    message = _changed("BaseOptimizer._clip_gradients",
                       "optimizer.clip_gradients / patches.replace_clipping_of")
    assert _parameters(getattr(BaseOptimizer, patches.GRADIENT_CLIP)) == ["self", "grads"], message
    optimizer, weights = keras.optimizers.SGD(1.0, clipvalue=0.25), _weights()
    optimizer.build(weights)
    seen = []

    def clip(self, gradients):
        seen.append(len(gradients))
        return keras_optimizer.clip_gradients(self, gradients)  # the class's: no recursion

    patches.replace_clipping_of(optimizer, clip)
    optimizer.apply([tf.fill(w.shape, 3.0) for w in weights], weights)
    assert seen == [2], message
    assert [w.numpy().max() for w in weights] == [0.75, 0.75], message  # 1 - 0.25


def test_all_reduce_sum_gradients_takes_and_returns_pairs():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    message = _changed("TFOptimizer._all_reduce_sum_gradients", "patches.all_reduce_sum")
    assert _parameters(getattr(TFOptimizer, patches.GRADIENT_ALL_REDUCE)) == [
        "self", "grads_and_vars"], message
    optimizer, (a, _) = keras.optimizers.SGD(), _weights()
    (gradient, variable), = patches.all_reduce_sum(optimizer, [(tf.ones([3]), a)])
    assert variable is a and gradient.numpy().tolist() == [1.0, 1.0, 1.0], message


def test_checkpoint_children_name_the_weights_and_state_lists(tmp_path):
    message = _changed("the optimizer's _trackable_children",
                       "optimizer.is_weights_child / patches.replace_checkpoint_children_of")
    optimizer, weights = keras.optimizers.Adam(), _weights()
    optimizer.build(weights)
    seen = []

    def wrap(children):
        seen.append(dict(children))
        return children

    patches.replace_checkpoint_children_of(optimizer, wrap)
    path = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "ckpt"))
    assert seen, message
    children = seen[0]
    weights_children = [name for name in children if keras_optimizer.is_weights_child(name)]
    assert len(weights_children) == 1, (message, sorted(children))
    assert list(children[weights_children[0]]) == weights, message
    state = {id(v) for v in optimizer.variables}
    assert {id(v) for v in children["_variables"]} == state, (message, sorted(children))
    slot_lists = [name for name, child in children.items() if name != "_variables"
                  and isinstance(child, (list, tuple, type(children["_variables"])))
                  and child and all(id(v) in state for v in child)]
    assert sorted(slot_lists) == ["_momentums", "_velocities"], (message, sorted(children))
    assert any(name.startswith("optimizer/_variables/")
               for name, _ in tf.train.list_variables(path)), message


def test_add_variable_from_reference_makes_each_weights_state():
    message = _changed("BaseOptimizer.add_variable_from_reference",
                       "optimizer.recording_state_variables")
    optimizer, weights = keras.optimizers.Adam(), _weights()
    made = []
    with keras_optimizer.recording_state_variables(
            optimizer, lambda reference, variable: made.append((reference, variable))):
        optimizer.build(weights)
    # Adam: a momentum and a velocity per weight, each made from its weight.
    assert sorted(id(reference) for reference, _ in made) == sorted(
        2 * [id(w) for w in weights]), message
    assert {id(v) for _, v in made} <= {id(v) for v in optimizer.variables}, message
    assert not patches.has_own_method(optimizer, "add_variable_from_reference"), message


def test_learning_rate_is_one_of_the_optimizer_variables():
    message = _changed("BaseOptimizer._learning_rate", "optimizer.learning_rate_variable")
    optimizer = keras.optimizers.SGD(0.25)
    optimizer.build(_weights())
    rate = keras_optimizer.learning_rate_variable(optimizer)
    assert rate is not None and any(v is rate for v in optimizer.variables), message
    assert float(rate.numpy()) == 0.25, message
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert keras_optimizer.learning_rate_variable(keras.optimizers.SGD(schedule)) is None, message


def test_value_is_the_tensorflow_variable_behind_a_keras_variable():
    message = _changed("Variable._value", "model_state.tensorflow_variable")
    variable = keras.Variable(np.ones([2], "float32"))
    storage = keras_model_state.tensorflow_variable(variable)
    assert isinstance(storage, tf.Variable) and storage is variable.value, message
    from keras.src.backend.common.variables import AutocastScope

    with AutocastScope("float16"):  # (.value is cast there; the storage is not)
        assert variable.value.dtype == tf.float16, message
        assert keras_model_state.tensorflow_variable(variable) is storage, message
    tf_variable = tf.Variable(1.0)
    assert keras_model_state.tensorflow_variable(tf_variable) is tf_variable


def test_a_layer_call_runs_in_the_autocast_scope_gather_units_enters_again():
    message = _changed("backend.get_autocast_scope / AutocastScope",
                       "compiled.autocast_scope / in_autocast_scope")
    seen = []

    class Seeing(keras.layers.Dense):
        def call(self, inputs):
            seen.append(keras_compiled.autocast_scope())
            return super().call(inputs)

    Seeing(2, dtype="mixed_float16")(np.ones((1, 3), "float32"))
    assert seen[0] is not None and seen[0].dtype == "float16", message
    variable = keras.Variable(np.ones([2], "float32"))
    with keras_compiled.in_autocast_scope(seen[0]):
        assert variable.value.dtype == tf.float16, message
    with keras_compiled.in_autocast_scope(None):
        assert variable.value.dtype == tf.float32, message


def test_a_keras_variable_is_read_and_written_through_what_sliced_weights_replaces():
    """Every way Keras reads or writes a variable's value goes through a
    method `sliced_weights` gives its sliced class: a new operator reading
    ``self.value`` would read the slice, so it fails here first."""
    message = _changed("how a Variable is read or written", "sliced_weights")
    from keras.src.backend.common.variables import AutocastScope, Variable as KerasVariable

    reading_value = {name for name, member in vars(KerasVariable).items()
                     if name.startswith("__") and callable(member)
                     and "self.value" in inspect.getsource(member)}
    handled = set(sliced_weights._OPERATORS) | {"__array__", "__pos__", "__int__", "__float__",
                                                "__round__", "__repr__"}
    assert reading_value <= handled, (message, sorted(reading_value - handled))
    whole = tf.reshape(tf.range(6, dtype=tf.float32), [2, 3])
    written = []
    variable = keras.Variable(np.zeros([2, 3], "float32"))
    sliced_weights.store_in_slices(variable, tf.Variable(tf.zeros([3])), sliced_weights.SlicedReads(
        read_in_replica=lambda: None, whole=lambda: whole, assign_whole=written.append,
        worker_pieces=lambda: None))
    np.testing.assert_array_equal(tf.convert_to_tensor(variable), whole, err_msg=message)
    np.testing.assert_array_equal(variable.numpy(), whole, err_msg=message)
    np.testing.assert_array_equal(np.asarray(variable), whole, err_msg=message)
    np.testing.assert_array_equal(variable * 2.0, whole * 2.0, err_msg=message)
    np.testing.assert_array_equal(variable[1], whole[1], err_msg=message)
    np.testing.assert_array_equal(tf.matmul(variable, tf.ones([3, 1])),
                                  tf.matmul(whole, tf.ones([3, 1])), err_msg=message)
    variable.assign(np.ones([2, 3], "float32"))
    assert len(written) == 1 and written[0].shape == (2, 3), message
    assert tuple(variable.value.shape) == (3,), message  # (the storage: the slice)
    with AutocastScope("float16"):
        assert tf.convert_to_tensor(variable).dtype == tf.float16, message
    assert type(variable).__hash__ is type(keras.Variable(1.0)).__hash__, message


def test_train_step_calls_the_models_own_compute_loss():
    message = _changed("Trainer.compute_loss (per-object)", "patches.replace_methods_of")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    keras_compute_loss, calls = model.compute_loss, []

    @functools.wraps(keras_compute_loss)
    def compute_loss(*args, **kwargs):
        calls.append(1)
        return keras_compute_loss(*args, **kwargs)

    assert not patches.has_own_method(model, "compute_loss")
    patches.replace_methods_of(model, {"compute_loss": compute_loss})
    assert patches.has_own_method(model, "compute_loss")
    model.train_on_batch(np.ones([4, 3]), np.ones([4, 2]))
    assert calls, message
    patches.restore_methods_of(model, ("compute_loss",))
    assert not patches.has_own_method(model, "compute_loss")
    assert model.compute_loss.__func__ is type(model).compute_loss


def test_saving_calls_the_optimizers_own_save_and_load_own_variables(tmp_path):
    message = _changed("save_own_variables / load_own_variables (per-object)",
                       "patches.replace_methods_of")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.train_on_batch(np.ones([4, 3]), np.ones([4, 2]))
    optimizer, calls = model.optimizer, []
    keras_save, keras_load = optimizer.save_own_variables, optimizer.load_own_variables
    assert _parameters(keras_save) == ["store"] and _parameters(keras_load) == ["store"], message
    patches.replace_methods_of(optimizer, {
        "save_own_variables": lambda store: (calls.append("save"), keras_save(store)),
        "load_own_variables": lambda store: (calls.append("load"), keras_load(store))})
    path = str(tmp_path / "model.keras")
    model.save(path)
    model.load_weights(path)
    assert calls == ["save", "load"], (message, calls)


class _MyAdam(keras.optimizers.Adam):
    """Adam with other defaults: its update is Adam's."""

    def __init__(self, learning_rate=0.02, **kwargs):
        super().__init__(learning_rate=learning_rate, beta_2=0.99, **kwargs)


class _OwnStepAdam(keras.optimizers.Adam):
    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient, variable, learning_rate)


def test_updates_elementwise_by_capability():
    message = _changed("an optimizer's update methods", "optimizer.updates_elementwise")
    accepted = [cls() for cls in keras_optimizer.elementwise_classes()]
    accepted += [keras.optimizers.AdamW(), _MyAdam()]
    for optimizer in accepted:
        assert keras_optimizer.updates_elementwise(optimizer), (message, type(optimizer))
        assert callable(getattr(type(optimizer), patches.DISTRIBUTED_UPDATE)), message
    refused = [keras.optimizers.Nadam(), keras.optimizers.Lamb(), keras.optimizers.Adafactor(),
               keras.optimizers.Muon(), keras.optimizers.ScheduleFreeAdamW(), _OwnStepAdam()]
    for optimizer in refused:
        assert not keras_optimizer.updates_elementwise(optimizer), (message, type(optimizer))
    assert keras_optimizer.elementwise_base(_MyAdam()) is keras.optimizers.Adam
    assert keras_optimizer.overridden_update_methods(_OwnStepAdam()) == ["update_step"]


def test_a_layers_call_replaced_on_the_instance_is_what_keras_runs():
    """`layer_units.wrap_call` sets ``layer.call`` on the instance: Keras'
    ``Layer.__call__`` must run it, with the arguments Keras fills in from
    the call's signature (``training=``, ``mask=``), eagerly and in a
    functional model."""
    message = _changed("Layer.__call__ running self.call", "layer_units.wrap_call")
    seen = []

    def recording(original):
        def call(*args, **kwargs):
            seen.append(sorted(kwargs))
            return original(*args, **kwargs)
        return call

    dropout = keras.layers.Dropout(0.5)
    masked = keras.layers.LSTM(2)
    assert layer_units.wrap_call(dropout, "contract", recording)
    assert layer_units.wrap_call(masked, "contract", recording)
    assert not layer_units.wrap_call(dropout, "contract", recording)  # (once per policy)
    dropout(np.ones((2, 3), "float32"), training=True)
    assert seen.pop() == ["training"], message
    inputs = keras.Input((4,), dtype="int32")
    hidden = keras.layers.Embedding(5, 3, mask_zero=True)(inputs)
    model = keras.Model(inputs, masked(hidden))
    seen.clear()
    model(np.array([[1, 2, 0, 0]]))
    assert seen and "mask" in seen.pop(), message


def test_an_embeddings_lookup_is_the_class_call_a_subclass_reaches_through_super():
    """`patches.wrap_embedding_call` wraps ``keras.layers.Embedding.call``
    (the class's): a plain ``Embedding`` and a subclass whose own call
    looks ids up with ``super().call(ids)`` (keras-rs' ``EmbedReduce``)
    must both run it, with the ids as its one argument."""
    message = _changed("Embedding.call", "patches.wrap_embedding_call / embedding_rows")
    assert _parameters(keras.layers.Embedding.call) == ["self", "inputs"], message

    class Pooled(keras.layers.Embedding):  # (EmbedReduce's shape: lookup, then a combiner)
        def call(self, inputs):
            return keras.ops.mean(super().call(inputs), axis=-2)

    plain, pooled = keras.layers.Embedding(6, 2), Pooled(6, 2)
    ids = np.array([[1, 5], [2, 2]], "int32")
    for layer in (plain, pooled):
        layer.build(ids.shape)
    seen = []

    def record(keras_call):
        def call(self, inputs, *args, **kwargs):
            seen.append(self.name)
            return keras_call(self, inputs, *args, **kwargs)
        return call

    keras_call = keras.layers.Embedding.call
    try:
        patches.wrap_embedding_call(record)
        found = plain(ids), pooled(ids)
    finally:
        keras.layers.Embedding.call = keras_call
    assert seen == [plain.name, pooled.name], message
    np.testing.assert_allclose(found[1], np.mean(np.asarray(pooled.embeddings)[ids], axis=-2),
                               rtol=1e-6)


def test_a_unit_keeps_the_keras_masks_a_custom_gradient_drops():
    """`layer_units.run_as_unit`: the outputs carry the layer's Keras mask
    (read with `compiled.keras_masks`), and the gradient reaches the
    inputs and the weights."""
    message = _changed("where Keras keeps a tensor's mask", "compiled.keras_masks / layer_units")
    embedding = keras.layers.Embedding(5, 3, mask_zero=True)
    ids = tf.constant([[1, 2, 0]])
    embedding.build(ids.shape)
    dense = keras.layers.Dense(2)

    def forward(tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            result = dense(tensors[0])
            result._keras_mask = keras_compiled.keras_masks(tensors[0])  # (as a masking layer)

        def gradient(upstream, variables):
            return tape.gradient(result, list(tensors) + variables, output_gradients=upstream)

        return result, gradient

    with tf.GradientTape() as outer:
        vectors = embedding(ids)
        outer.watch(vectors)
        call = layer_calls.LayerCall((vectors,), {})
        outputs = layer_units.run_as_unit(call, forward)
        loss = tf.reduce_sum(outputs)
    mask = keras_compiled.keras_masks(outputs)
    assert mask is not None and mask.numpy().tolist() == [[True, True, False]], message
    gradients = outer.gradient(loss, [vectors] + dense.trainable_variables)
    assert all(g is not None for g in gradients)


def test_a_keras_variables_constraint_is_what_apply_runs_after_the_update():
    """`layer_units.replace_constraint` sets ``Variable.constraint``: the
    optimizer's ``apply`` must run the replaced one after the update."""
    message = _changed("Variable.constraint as apply runs it", "layer_units.replace_constraint")
    layer = keras.layers.Dense(2, kernel_constraint=keras.constraints.NonNeg())
    layer.build((1, 1))
    variable = layer.kernel
    variable.assign([[3.0, -3.0]])
    ran = []

    def recording(constraint):
        def constrain(value):
            ran.append(1)
            return constraint(value)
        return constrain

    assert layer_units.replace_constraint(variable, recording, policy="contract")
    assert not layer_units.replace_constraint(variable, recording, policy="contract")
    keras.optimizers.SGD(1.0).apply([tf.constant([[1.0, 1.0]])], [variable])
    assert ran, message
    np.testing.assert_allclose(variable.numpy(), [[2.0, 0.0]], err_msg=message)


def test_a_model_parallel_distribution_keeps_its_layout_map():
    """``distributions.layout_map_of``: the LayoutMap a ModelParallel was
    made with (its rules, checked against a model by tfdist.parallel.layouts)."""
    from tfdist._internal.keras import distributions

    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
    rules = keras.distribution.LayoutMap(mesh)
    rules["d1/kernel"] = (None, "model")
    distribution = keras.distribution.ModelParallel(layout_map=rules, batch_dim_name="batch")
    assert distributions.layout_map_of(distribution) is rules


def test_a_layer_output_rule_runs_through_the_backends_distribute_tensor():
    """``distributions.lay_out_outputs_on_the_batch``: Layer.__call__ calls
    the TensorFlow backend's ``distribute_tensor`` for a ``<path>/output``
    rule of the distribution set (missing on TensorFlow: an AttributeError
    without tfdist); given, a batch layout returns the output as it is and
    any other is refused."""
    from tfdist._internal.keras import distributions

    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
    rules = keras.distribution.LayoutMap(mesh)
    rules["d1/output"] = ("batch", None)
    layer = keras.layers.Dense(2, name="d1")
    distributions.lay_out_outputs_on_the_batch("batch")
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=rules, batch_dim_name="batch"))
    try:
        np.testing.assert_allclose(layer(np.ones((3, 4), "float32")).shape, (3, 2))
        rules["d2/output"] = (None, "model")
        with pytest.raises(NotImplementedError, match="over the batch's axis 'batch'"):
            keras.layers.Dense(2, name="d2")(np.ones((3, 4), "float32"))
    finally:
        keras.distribution.set_distribution(None)


def test_multi_head_attention_computes_its_attention_in_the_replaceable_method():
    """``attention.replace_compute_attention``: ``MultiHeadAttention.call``
    computes the attention between its projections by calling the
    instance's ``_compute_attention`` (its query, key and value projected,
    [B, T, N, H]), and still takes its causal path when the instance's is
    replaced (the check reads the class's); its projections are the public
    ``query_dense`` / ``key_dense`` / ``value_dense`` / ``output_dense``."""
    from tfdist._internal.keras import attention

    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
    x = np.random.default_rng(0).normal(size=(2, 4, 5)).astype("float32")
    expected = layer(x, x, use_causal_mask=True).numpy()
    seen = []

    def make(original):
        def compute(query, key, value, *args, **kwargs):
            seen.append((tuple(query.shape), tuple(key.shape), tuple(value.shape)))
            return original(query, key, value, *args, **kwargs)
        return compute

    attention.replace_compute_attention(layer, make)
    np.testing.assert_allclose(layer(x, x, use_causal_mask=True).numpy(), expected, atol=1e-6)
    assert seen == [((2, 4, 2, 3),) * 3], seen
    assert all(isinstance(p, keras.layers.EinsumDense) for p in (
        layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense))
    assert hasattr(layer, "attention_axes") and hasattr(layer, "dropout")


def test_adagrad_keeps_each_weights_accumulator_where_its_update_reads_it():
    """`embedding_rows.update_touched_rows` replaces Adagrad's
    ``update_step`` and reads a weight's accumulator as Keras' does:
    ``_accumulators[_get_variable_index(variable)]``, the optimizer's
    ``update_step`` being what ``apply`` calls for each weight."""
    weight = keras.Variable(np.ones((3, 2), "float32"))
    optimizer = keras.optimizers.Adagrad(0.5, initial_accumulator_value=0.25)
    optimizer.build([weight])
    accumulator = optimizer._accumulators[optimizer._get_variable_index(weight)]  # pylint: disable=protected-access
    assert tuple(accumulator.shape) == (3, 2)
    called = []
    keras_update = optimizer.update_step
    optimizer.update_step = lambda *args: (called.append(1), keras_update(*args))
    optimizer.apply([tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([3, 2]))],
                    [weight])
    assert called == [1]
    np.testing.assert_allclose(accumulator.numpy(), [[0.25] * 2, [1.25] * 2, [0.25] * 2])
