"""Pins the Keras internals tfdist reads (tfdist/_internal/keras/, one module per job).

If a Keras upgrade changes them, this fails first, with a clear name.
"""

import subprocess
import sys

import keras
import tensorflow as tf

from tfdist._internal.keras import compiled as keras_compiled, model_state as keras_model_state


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
        "from keras.src.backend.tensorflow import nn, optimizer\n"
        "from keras.src.losses import loss\n"
        "patched = [f.__qualname__ for f in (nn._compute_moments, nn._compute_moments_sync,\n"
        "           loss.scale_loss_for_distribution, loss.unscale_loss_for_distribution,\n"
        "           optimizer.TFOptimizer._all_reduce_sum_gradients)\n"
        "           if not f.__module__.startswith('keras')]\n"
        "print(patched)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_every_keras_function_tfdist_wraps_is_where_it_looks():
    """`tfdist._internal.keras.patches` finds these (without changing them)."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow import optimizer as tf_optimizer, random as tf_random
    from keras.src.backend.tensorflow.core import Variable
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
