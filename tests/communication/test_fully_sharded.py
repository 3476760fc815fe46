"""Fully sharded weights (`tfdist.communication.FullySharded`) against
single-device Keras: what each replica holds, which collectives a step
runs, and what is refused."""

import json
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from conformance import axes, harness
from tests.support import mixed_precision, reference as ref, short_form, step_progress
from tests.support.strategy_columns import collectives_bounded
from tests.support.models import GuideTrainStep, compiled_model
from tfdist.communication import Compression, FullySharded
from tfdist.errors import ConfigurationError

BATCH = 16
EXAMPLES = 70  # a last batch of 6: uneven over 4 replicas


def _attached(replicas: int, optimizer: str, l2: float = 0.01):
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(l2=l2), optimizer)
    return tfdist.attach(model, strategy, communication=FullySharded()), strategy


@pytest.mark.parametrize("optimizer,replicas", [("adam", 3), ("sgd", 2), ("adam", 4)])
def test_fit_evaluate_and_predict_equal_one_device_keras(optimizer, replicas):
    """An MLP whose L2 penalty reads each kernel a second time, momentum SGD
    and Adam, a partial last batch, sample weights."""
    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected, expected_history = ref.keras_fit(dataset, 2, optimizer)
    model, _ = _attached(replicas, optimizer)
    history = model.fit(dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history.history)
    ref.assert_logs_close(expected.evaluate(dataset, verbose=0, return_dict=True),
                          model.evaluate(dataset, verbose=0, return_dict=True))
    inputs = dataset.map(lambda x, *rest: x)
    np.testing.assert_allclose(expected.predict(inputs, verbose=0),
                               model.predict(inputs, verbose=0), atol=1e-6)


@pytest.mark.parametrize("reshard", [True, False])
def test_a_weight_constraint_constrains_the_whole_weight_as_one_device(reshard):
    """A max-norm constraint (a norm over a kernel's columns, not elementwise)
    after each update: each replica gathers the updated kernel, constrains it
    whole and keeps its slice, as one device does (it once waited forever:
    each replica wrote every replica's slice)."""
    def build():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([
            keras.Input((ref.NUM_FEATURES,)),
            keras.layers.Dense(8, "tanh", kernel_constraint=keras.constraints.MaxNorm(0.4)),
            keras.layers.Dense(ref.NUM_CLASSES, "softmax",
                               bias_constraint=keras.constraints.NonNeg())])
        return ref.compile_model(model, "adam")

    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected = build()
    expected_history = expected.fit(dataset, epochs=2, verbose=0).history
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = build()
    model = tfdist.attach(model, strategy,
                          communication=FullySharded(reshard_after_forward=reshard))
    history = model.fit(dataset, epochs=2, verbose=0).history
    ref.assert_weight_lists_close(expected.get_weights(), model.get_weights())
    ref.assert_logs_close(expected_history, history)
    assert np.linalg.norm(model.get_weights()[0], axis=0).max() <= 0.4 + 1e-6


def test_the_trainer_equals_one_device_keras():
    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected, expected_history = ref.keras_fit(dataset, 2, "adam")
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy, communication=FullySharded())
    history = trainer.fit(dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history.history)


def test_a_models_own_train_step_equals_one_device():
    """keras.io's own ``train_step`` (its loss carries the replica's share
    of the batch, so its gradient is scaled before the reduce-scatter)."""
    x, y, _ = ref.classification_arrays(EXAMPLES)
    expected = compiled_model(GuideTrainStep)
    expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = compiled_model(GuideTrainStep)
    model = tfdist.attach(model, strategy, communication=FullySharded())
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)


def test_each_replica_holds_one_slice_of_every_weight_and_of_its_state():
    model, strategy = _attached(3, "adam")
    model.fit(ref.global_batches(EXAMPLES, BATCH), epochs=1, verbose=0)
    for weight in model.trainable_weights:
        size = int(np.prod(weight.shape))
        slices = [tuple(c.shape) for c in strategy.experimental_local_results(weight.value)]
        assert slices == [(-(-size // 3),)] * 3, (weight.path, slices)
    state = [v for v in model.optimizer.variables if len(v.shape) > 0]
    sizes = sorted(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert sorted(int(v.shape[0]) for v in state) == sorted(-(-s // 3) for s in sizes * 2)
    assert [w.shape for w in model.get_weights()] == [
        tuple(w.shape) for w in model.trainable_weights]


def _traced_step(model, strategy, x, y, loss_fn):
    """After a ``fit`` on (x, y) (which attaches, and builds the optimizer):
    a step on them as a hand-written loop writes it, traced (its concrete
    function)."""
    model.fit(x, y, batch_size=len(x), verbose=0)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_weights)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_weights))

    step = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))
    return step.get_concrete_function(tf.constant(x), tf.constant(y))


def _ops(concrete) -> list:
    """The op types of a traced function (a step without loops or
    branches: every op is in its graph)."""
    return [op.type for op in concrete.graph.get_operations()]


# Per weight and replica, the all-gathers of a step: the forward pass's, and
# the backward pass's again when the layer's gathered weights are freed after
# its forward pass (``reshard_after_forward``).
GATHERS = {True: 2, False: 1}


@pytest.mark.parametrize("reshard", [True, False])
def test_a_step_gathers_each_weight_and_reduce_scatters_its_gradient_and_nothing_else(reshard):
    """Per replica and weight: one all-gather per pass that reads it, one
    all-to-all (the reduce-scatter of its gradient); no all-reduce of a
    gradient, no gather after the update."""
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(l2=0.0), "sgd")
    model = tfdist.attach(model, strategy,
                          communication=FullySharded(reshard_after_forward=reshard))
    x, y, _ = ref.classification_arrays(8)
    ops = _ops(_traced_step(model, strategy, x, y, keras.losses.SparseCategoricalCrossentropy()))
    weights = len(model.trainable_weights)
    assert ops.count("CollectiveGatherV2") == 2 * weights * GATHERS[reshard]
    assert ops.count("CollectiveAllToAllV2") == 2 * weights
    assert not [op for op in ops if "Reduce" in op and "Collective" in op], ops


def _ops_everywhere(concrete) -> list:
    """The op types of a traced function and of every function its graph
    calls (loop bodies, branches, their gradients)."""
    graph_def = concrete.graph.as_graph_def()
    return [node.op for node in graph_def.node] + [
        node.op for function in graph_def.library.function for node in function.node_def]


@pytest.mark.parametrize("reshard", [True, False])
def test_a_weight_read_in_a_loop_is_gathered_once_per_pass_before_the_loop(reshard):
    """An LSTM reads its kernels at every time step, inside the while loop
    Keras builds: one gather per weight, replica and pass, in the step,
    none in the loop's body or its gradient."""
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4),
                                  keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.random.default_rng(0).random((8, 5, 3), "float32"), np.zeros(8, "int32")
    model = tfdist.attach(model, strategy,
                          communication=FullySharded(reshard_after_forward=reshard))
    concrete = _traced_step(model, strategy, x, y,
                            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    weights = len(model.trainable_weights)  # the LSTM's 3, the Dense layer's 2
    assert _ops(concrete).count("CollectiveGatherV2") == 2 * weights * GATHERS[reshard]
    everywhere = _ops_everywhere(concrete)
    assert "While" in everywhere or "StatelessWhile" in everywhere  # (the loop is there)
    assert everywhere.count("CollectiveGatherV2") == 2 * weights * GATHERS[reshard]
    assert everywhere.count("CollectiveAllToAllV2") == 2 * weights


def test_freed_after_forward_at_most_two_layers_are_gathered_at_once():
    """The live-tensor peak of a step (TensorFlow's BFC allocator, in a
    process of its own) over 4 replicas and 12 equal layers, in units of
    one layer's weight per replica: freed after the forward pass, it holds
    the gradients' slices (12/4) plus at most two gathered layers and one
    whole gradient being reduce-scattered; kept whole, all 12 layers. The
    same 12 layers inside one layer of the model are one unit (all 12
    gathered at once) unless ``units=`` names them by path."""
    program = pathlib.Path(__file__).parents[1] / "programs" / "fully_sharded_peak.py"
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    assert peaks["keep_gathered"] >= 12, peaks
    assert peaks["reshard"] <= 12 / 4 + 3, peaks
    assert peaks["reshard_no_prefetch"] <= 12 / 4 + 3, peaks
    assert peaks["nested_one_unit"] >= 12, peaks
    assert peaks["nested_units"] <= 12 / 4 + 3, peaks


class _Checked(keras.layers.Dense):
    """A Dense layer that checks its input (a stateful op reading no variable)."""

    def call(self, inputs):
        with tf.control_dependencies([tf.debugging.assert_less(tf.reduce_max(inputs), 1e9)]):
            return super().call(tf.identity(inputs))


@pytest.mark.parametrize("middle,found", [
    # (no bias before the normalization: its gradient is round-off, which
    # Adam would scale up)
    (lambda: keras.layers.BatchNormalization(synchronized=True, name="norm"), "Assign"),
    (lambda: _Checked(3, name="norm"), "Assert"),
])
def test_a_layer_that_updates_statistics_or_checks_keeps_its_gathered_weights_and_says_so(
        middle, found):
    """BatchNormalization updates its moving statistics in the forward
    pass, so a second forward pass in the backward pass would update them
    twice; a layer that checks its input (``tf.debugging.assert_*``) would
    check again in replica 0's backward pass, which TensorFlow runs before
    replica 1's first check (they run in the order traced), while replica
    0's backward pass waits for replica 1's gathers: the step hung. Neither
    layer is freed after its forward pass (a warning naming it) and the
    numbers stay one device's."""
    def build():
        model = keras.Sequential([keras.Input((4,)),
                                  keras.layers.Dense(3, use_bias=False, name="dense"),
                                  middle(), keras.layers.Dense(2, name="head")])
        model.compile("adam", "mse")
        return model

    x = np.random.default_rng(1).random((12, 4), "float32")
    y = np.random.default_rng(2).random((12, 2), "float32")
    expected = build()
    initial = expected.get_weights()
    expected.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = build()
        model.set_weights(initial)
    model = tfdist.attach(model, strategy, communication=FullySharded())
    with collectives_bounded(strategy, seconds=60), pytest.warns(
            UserWarning, match=f"layer .norm. runs ops in its forward pass that a second run "
                               f"would repeat .{found}"):
        model.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    ref.assert_weights_close(expected, model)


def test_a_checkpoint_loads_into_plain_keras_on_one_device(tmp_path):
    model, _ = _attached(2, "adam")
    model.fit(ref.global_batches(EXAMPLES, BATCH), epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    ref.assert_weight_lists_close(model.get_weights(), plain.get_weights(), atol=0.0)
    weights = str(tmp_path / "w.weights.h5")
    model.save_weights(weights)
    one_device = ref.compile_model(ref.build_mlp(seed=7), "adam")
    one_device.load_weights(weights)
    ref.assert_weight_lists_close(model.get_weights(), one_device.get_weights(), atol=0.0)


@pytest.mark.parametrize("async_write", [False, True])
def test_the_trainers_checkpoints_restore_whole_into_one_device_keras(tmp_path, async_write):
    """A checkpoint written during training (in the background too: its host
    copy is of the whole weights) restores into a plain one-device model
    and its optimizer."""
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy, communication=FullySharded(),
                             checkpointing=tfdist.CheckpointOptions(
                                 str(tmp_path), async_write=async_write))
    trainer.fit(ref.global_batches(EXAMPLES, BATCH), epochs=1, verbose=0)
    plain = ref.compile_model(ref.build_mlp(seed=99), "adam")
    plain.optimizer.build(plain.trainable_variables)
    tf.train.Checkpoint(model=plain).restore(
        tf.train.latest_checkpoint(str(tmp_path))).expect_partial()
    ref.assert_weights_close(model, plain, atol=0)


def test_set_weights_stores_each_replicas_slice():
    model, strategy = _attached(3, "sgd")
    model.fit(ref.global_batches(BATCH, BATCH), verbose=0)  # (attaches: the weights are sliced)
    values = [np.arange(np.prod(w.shape), dtype="float32").reshape(w.shape)
              for w in model.trainable_weights]
    model.set_weights(values)
    ref.assert_weight_lists_close(values, model.get_weights(), atol=0.0)
    kernel = model.trainable_weights[0]
    first = strategy.experimental_local_results(kernel.value)[1].numpy()
    length = -(-int(np.prod(kernel.shape)) // 3)
    np.testing.assert_array_equal(first, values[0].reshape(-1)[length:2 * length])


def _refused(model, strategy, match):
    with pytest.raises(ConfigurationError, match=match):
        tfdist.Trainer(model, strategy, communication=FullySharded())


def _clipping_model(clip: dict) -> keras.Model:
    model = ref.build_mlp()
    model.compile(keras.optimizers.Adam(0.02, **clip), "sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("clip,replicas", [({"clipnorm": 0.05}, 3),
                                           ({"global_clipnorm": 0.05}, 4),
                                           ({"clipvalue": 0.002}, 2)])
def test_clipping_clips_the_batch_gradient_as_one_device(clip, replicas):
    """Each replica holds a slice of each weight's gradient: a norm is the
    sum over the slices (clipping each slice by its own norm would move
    the weights 1e-3..1e-2 away; so would clipping each replica's share of
    the batch, as Keras alone does). 70 rows: a partial last batch."""
    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected = _clipping_model(clip)
    expected.fit(dataset, epochs=2, verbose=0, shuffle=False)
    unclipped = _clipping_model({})
    unclipped.fit(dataset, epochs=2, verbose=0, shuffle=False)
    assert ref.largest_difference(expected.get_weights(), unclipped.get_weights()) > 1e-3
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = _clipping_model(clip)
    model = tfdist.attach(model, strategy, communication=FullySharded())
    model.fit(dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model)


# (CI: 4 replicas; the conformance rows run mixed_float16 on the others)
@pytest.mark.parametrize("replicas", short_form.only([2, 4], in_ci=(4,)))
def test_mixed_precision_skips_an_overflowing_step_on_every_replica_as_one_device(replicas):
    """mixed_float16: the weights are gathered and updated in float32; one
    replica's slice of the gradient overflows, and every replica skips the
    update and halves the loss scale, as one device does."""
    expected = mixed_precision.one_device(mixed_precision.dense_model,
                                          mixed_precision.features_with_an_overflow())
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = mixed_precision.dense_model()
    tfdist.attach(model, strategy, communication=FullySharded())
    model.fit(mixed_precision.features_with_an_overflow(), epochs=mixed_precision.EPOCHS,
              verbose=0)
    scale = float(expected.optimizer.dynamic_scale.numpy())
    assert scale < 32768.0  # one device did skip steps (the initial scale is 2**15)
    assert float(model.optimizer.dynamic_scale.numpy()) == scale
    # (float16's tolerance: tests/replica/test_mixed_precision.py)
    assert mixed_precision.max_difference(expected, model) < 2e-4


def test_mixed_precision_embedding_and_lstm_equal_one_device():
    """Sparse Embedding gradients and an LSTM's kernels (gathered before
    Keras' loop) through a LossScaleOptimizer, Adam, on 3 replicas."""
    expected, tolerance = mixed_precision.references("mixed_float16", "adam")
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = mixed_precision.sequence_model("mixed_float16", "adam")
    tfdist.attach(model, strategy, communication=FullySharded())
    model.fit(mixed_precision.tokens(), epochs=mixed_precision.EPOCHS, verbose=0)
    assert mixed_precision.max_difference(expected, model) <= tolerance


@pytest.mark.parametrize("optimizer,pattern,replicas", [
    ("adam", "tokens", 3), ("rmsprop", "positions", 2),
    ("adagrad", "tokens_and_positions_one_table", 4), ("adamw", "one_table_twice", 2),
    ("adam", "tokens_global_clipnorm", 3)])
def test_sparse_gradients_update_as_on_one_device(optimizer, pattern, replicas):
    """Optimizers that square each entry of an Embedding's sparse gradient
    (one device's form: duplicates not summed) on token lookups split by
    rows, position lookups every replica makes whole, one table looked up
    both ways, and one table looked up twice; a partial last batch."""
    case = axes.optimizer_case(optimizer, pattern)
    examples = harness.BATCH_SHAPES["partial"]
    initial, reference = harness.run_keras(case, examples)
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    result = harness.run_attached(case, strategy, examples, initial,
                                  attach_options={"communication": FullySharded()})
    harness.assert_matches(reference, result, 1e-5)


@pytest.mark.parametrize("reshard", [True, False])
def test_a_table_is_looked_up_where_its_rows_live_and_never_gathered_whole(reshard):
    """An Embedding's step (`tfdist.communication.table_lookups`): its ids
    and their rows cross in two exchanges forward (each: an all-gather of
    the N x N lengths, one all-to-all), the rows' gradients in one
    backward; the table is never gathered (no gather of its 10 x 3 elements),
    and its gradient needs no reduce-scatter. The dense layer's two weights:
    gathered in each pass that reads them, reduce-scattered once."""
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(10, 3, name="tokens"),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids, labels = np.arange(32).reshape(8, 4) % 10, np.zeros(8, "int32")
    model = tfdist.attach(model, strategy,
                          communication=FullySharded(reshard_after_forward=reshard))
    concrete = _traced_step(model, strategy, ids, labels,
                            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ops = _ops(concrete)
    # per replica: the table's 3 exchanges + the dense layer's 2 weights' reads
    assert ops.count("CollectiveGatherV2") == 2 * (3 + 2 * GATHERS[reshard]), ops
    assert ops.count("CollectiveAllToAllV2") == 2 * (3 + 2), ops
    assert not [op for op in ops if "Reduce" in op and "Collective" in op], ops
    table_slice = [[5 * 3]]  # (rows 0-4 on replica 0, 5-9 on replica 1)
    assert [c.shape.as_list() for c in model.layers[0].embeddings.value.values] == \
        table_slice * 2
    sent = [op.inputs[0].shape.as_list() for op in concrete.graph.get_operations()
            if op.type == "CollectiveGatherV2"]  # (lengths, the dense layer's slices)
    assert max(np.prod(shape) for shape in sent) < 5 * 3, sent


def test_jit_compile_runs_the_step_without_xla_and_says_so():
    """The backward pass's reduce-scatters cannot run inside XLA on a
    mirrored strategy: the step runs without it, as one device's numbers."""
    dataset = ref.global_batches(EXAMPLES, BATCH)
    expected, _ = ref.keras_fit(dataset, 1, "adam")
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam", jit_compile=True)
    with pytest.warns(UserWarning, match="FullySharded.*without XLA"):
        tfdist.Trainer(model, strategy, communication=FullySharded()).fit(
            dataset, epochs=1, verbose=0)
    ref.assert_weights_close(expected, model)


def test_an_unbuilt_model_attached_outside_attach_and_the_trainer_is_refused():
    """`tfdist.attach` and `tfdist.Trainer` slice a model Keras builds later
    when tfdist builds it (tests/parallel/test_model_split.py); attached by
    hand, with nothing to build it, it is refused, naming the fix."""
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        unbuilt = keras.Sequential([keras.layers.Dense(2)])
        unbuilt.compile("sgd", "mse")
    with pytest.raises(ConfigurationError, match="must be built first"):
        FullySharded().attach_to(unbuilt, strategy)


@pytest.mark.parametrize("dtype,replicas", [("bf16", 2), ("fp16", 4)])
def test_with_compression_each_slice_is_updated_from_the_16_bit_gradient_sum(dtype, replicas):
    """Each replica's gradient crosses the reduce-scatter in 16 bits, as
    tests/communication/test_compression.py's one-device loop of 16-bit
    shares sums them (and not as the uncompressed run); the weights are
    gathered exactly."""
    from tests.communication import test_compression as compression  # pylint: disable=import-outside-toplevel

    dataset = ref.global_batches(64, 16)
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = compression._model()  # pylint: disable=protected-access
    tfdist.Trainer(model, strategy, communication=(FullySharded(), Compression(dtype))
                   ).fit(dataset, epochs=2, verbose=0)
    expected = compression._one_device(dataset, 2, dtype, replicas)  # pylint: disable=protected-access
    uncompressed = compression._one_device(dataset, 2)  # pylint: disable=protected-access
    assert ref.largest_difference(expected, uncompressed) > 1e-5
    assert ref.largest_difference(model.get_weights(), expected) < 1e-5


# -- gradient accumulation (tests/replica/test_accumulation.py's runs) ------

def _accumulation_stage(stage: str):
    return FullySharded() if stage == "fully sharded" else None


@pytest.mark.parametrize("optimizer,replicas,reshard", [("adam", 3, True), ("sgd", 2, False)])
def test_gradient_accumulation_equals_one_device_on_the_union_batches(optimizer, replicas,
                                                                      reshard):
    """``gradient_accumulation_steps=3``, micro-batches of 8 (each epoch's
    last union: 8 + 5 rows): one device's fit on batches of 24. Each
    replica's sums are one slice of each weight, not a whole copy."""
    from tests.replica import test_accumulation as accumulation  # pylint: disable=import-outside-toplevel

    x, y, _ = ref.classification_arrays(accumulation.ROWS)
    expected, expected_history = accumulation._one_device_on_unions(optimizer)  # pylint: disable=protected-access
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    model = accumulation._accumulating_model(strategy, optimizer)  # pylint: disable=protected-access
    trainer = tfdist.Trainer(model, strategy,
                             communication=FullySharded(reshard_after_forward=reshard))
    history = trainer.fit(x, y, batch_size=accumulation.MICRO, epochs=3, shuffle=False,
                          verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)
    sums = trainer._steps.accumulator._sums  # pylint: disable=protected-access
    assert [[tuple(c.shape) for c in strategy.experimental_local_results(s)] for s in sums] == [
        [(-(-int(np.prod(w.shape)) // replicas),)] * replicas for w in model.trainable_weights]


def test_gradient_accumulation_with_clipping_and_executions_that_straddle_updates():
    """4 replicas, ``global_clipnorm`` (the norm of the accumulated slices,
    summed over the replicas), two micro-batches per execution, so an
    update falls inside an execution and the epoch's last micro-batch (5
    rows) leaves a replica empty."""
    from tests.replica import test_accumulation as accumulation  # pylint: disable=import-outside-toplevel

    dataset = ref.global_batches(accumulation.ROWS, accumulation.MICRO, weighted=False)
    expected, expected_history = accumulation._one_device_on_unions(  # pylint: disable=protected-access
        "sgd", global_clipnorm=0.05)
    strategy = tfdist.make_strategy("mirrored", num_replicas=4)
    model = accumulation._accumulating_model(strategy, "sgd", global_clipnorm=0.05)  # pylint: disable=protected-access
    model.steps_per_execution = 2  # as model.compile(steps_per_execution=2) sets it
    history = tfdist.Trainer(model, strategy, communication=FullySharded()).fit(
        dataset, epochs=3, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


@pytest.mark.parametrize("first,second", [
    ((4, "fully sharded"), (2, "plain")),
    pytest.param((3, "plain"), (2, "fully sharded"), marks=pytest.mark.conformance_full),
])
def test_a_run_stopped_mid_accumulation_resumes_on_another_count_and_stage(tmp_path, first,
                                                                           second):
    """Saved at step 7 (epoch 2, micro-batch 2 of 3) and stopped: the sums
    are saved whole (the weights' shapes), and the run resumed on another
    replica count and stage ends at one device's weights."""
    from tests.replica import test_accumulation as accumulation  # pylint: disable=import-outside-toplevel

    dataset = ref.global_batches(accumulation.ROWS, accumulation.MICRO, weighted=False)
    expected, expected_history = accumulation._one_device_on_unions(epochs=2)  # pylint: disable=protected-access
    (first_replicas, first_stage), (replicas, stage) = first, second
    first_strategy = tfdist.make_strategy("mirrored", num_replicas=first_replicas)
    first_model = accumulation._accumulating_model(first_strategy)  # pylint: disable=protected-access
    with pytest.raises(KeyboardInterrupt):
        tfdist.Trainer(first_model, first_strategy,
                       communication=_accumulation_stage(first_stage),
                       checkpointing=tfdist.CheckpointOptions(str(tmp_path), every_steps=7)).fit(
            dataset, epochs=2, verbose=0, callbacks=[step_progress.interrupt_at(1, 2)])
    saved = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(tmp_path))))
    sums = [shape for name, shape in saved.items()
            if name.startswith("gradient_accumulation/sum_")]
    assert sums == [list(w.shape) for w in first_model.trainable_weights], saved
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    model = accumulation._accumulating_model(strategy)  # pylint: disable=protected-access
    trainer = tfdist.Trainer(model, strategy, communication=_accumulation_stage(stage),
                             checkpointing=tfdist.CheckpointOptions(str(tmp_path)))
    history = trainer.fit(dataset, epochs=2, verbose=0)
    assert trainer.step == 10 and history.epoch == [1]
    ref.assert_weights_close(expected, model)
    np.testing.assert_allclose(history.history["loss"], expected_history.history["loss"][1:],
                               rtol=1e-5)
