"""`tfdist.parallel.Pipeline` against one-device Keras: a model cut into
2-4 stages on logical CPUs, batches run as micro-batches in the GPipe and
1F1B schedules, end at one device's weights, history, evaluation and
predictions; each stage's weights, optimizer state and ops are on its
device; and what it cannot do yet is refused, naming it."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref, short_form
from tfdist.errors import ConfigurationError
from tfdist.parallel import device_traffic

# (several stages per device: tests/parallel/test_interleaved.py)
ONE_STAGE_PER_DEVICE = ("gpipe", "1f1b")
EXAMPLES = 38  # batches of 8: the last has 6 rows (not a multiple of m = 4 or 8)


def _model(skip: bool = False, optimizer=None) -> keras.Model:
    """A functional MLP with 4 weighted layers (L2 on the first, a max-norm
    constraint on the second's kernel); ``skip``:
    the first layer's output also feeds the third's (across cuts);
    ``optimizer``: a function making it (default: the tests' Adam)."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((ref.NUM_FEATURES,))
    h1 = keras.layers.Dense(8, "relu", name="h1",
                            kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    h2 = keras.layers.Dense(8, "tanh", name="h2",
                            kernel_constraint=keras.constraints.MaxNorm(0.6))(h1)
    h3 = keras.layers.Dense(8, "relu", name="h3")(h2)
    if skip:
        h3 = keras.layers.Add(name="skip")([h3, h1])
    outputs = keras.layers.Dense(ref.NUM_CLASSES, "softmax", name="out")(h3)
    model = ref.compile_model(keras.Model(inputs, outputs), "adam")
    if optimizer is not None:
        model.compile(optimizer=optimizer(), loss=model.loss, metrics=["accuracy"])
    return model


def _adamw():
    return keras.optimizers.AdamW(learning_rate=0.02, weight_decay=0.1)


def _adam_global_clipnorm():
    return keras.optimizers.Adam(learning_rate=0.02, global_clipnorm=0.05)


def _sgd_clipnorm():
    return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, clipnorm=0.05)


UPDATE_FORMS = [_adamw, _adam_global_clipnorm, _sgd_clipnorm]


def _fit(model, batch_size=8, epochs=2):
    x, y, w = ref.classification_arrays(EXAMPLES)
    history = model.fit(x, y, sample_weight=w, batch_size=batch_size, epochs=epochs,
                        shuffle=False, verbose=0).history
    return (model.get_weights(), history, model.evaluate(x, y, batch_size=batch_size, verbose=0),
            model.predict(x, batch_size=batch_size, verbose=0))


def _assert_equal_to(expected, actual):
    weights, history, evaluation, predictions = expected
    ref.assert_weight_lists_close(weights, actual[0])
    ref.assert_logs_close(history, actual[1])
    np.testing.assert_allclose(actual[2], evaluation, rtol=1e-5)
    np.testing.assert_allclose(actual[3], predictions, atol=1e-6, rtol=0)


CASES = [  # (cuts, micro-batches, batch size)
    (["h2"], 4, 8),               # 2 stages; the last batch of 6: micro-batches of 2, 2, 2, 0
    (["h1", "h3"], 4, 8),         # 3 stages
    (["h1", "h2", "h3"], 8, 8),   # 4 stages; last batch: 6 micro-batches of 1, 2 empty
    (["h2"], 1, 8),               # one micro-batch: the stages alone
    (["h1", "h2", "h3"], 3, 5),   # 3 does not divide 5: 2, 2, 1
]


@pytest.mark.parametrize("schedule", ONE_STAGE_PER_DEVICE)
@pytest.mark.parametrize("cuts,micro_batches,batch_size", CASES,
                         ids=[f"{len(c) + 1}stages-m{m}-b{b}" for c, m, b in CASES])
def test_a_pipeline_equals_one_device(schedule, cuts, micro_batches, batch_size):
    expected = _fit(_model(), batch_size)
    pipeline = tfdist.parallel.Pipeline(cuts=cuts, micro_batches=micro_batches,
                                        schedule=schedule)
    _assert_equal_to(expected, _fit(tfdist.attach(_model(), parallel=pipeline), batch_size))
    # Each stage's passes were ordered: a stage runs one pass at a time.
    assert pipeline.ordering_edges >= len(cuts) + 1


def test_a_users_own_order_runs_as_given_and_equals_one_device():
    """``schedule=`` as data: a user's order per stage (neither GPipe nor
    1F1B: stage 0 runs its forwards in pairs), enforced in the traced step,
    the same numbers as one device; an order that would wait forever is
    refused before anything runs, naming the stage and the pass."""
    order = ["F0 F1 B0 F2 F3 B1 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]
    pipeline = tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=4, schedule=order)
    assert pipeline.schedule == order
    assert "schedule=['F0 F1 B0" in repr(pipeline)
    _assert_equal_to(_fit(_model(), 8), _fit(tfdist.attach(_model(), parallel=pipeline), 8))
    assert pipeline.ordering_edges >= 2
    with pytest.raises(ConfigurationError, match=r"Pipeline: `schedule`: the schedule waits "
                                                 r"forever at time 1: stage 0 at B0"):
        tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=2,
                                 schedule=["F0 B0 F1 B1", "F1 F0 B0 B1"])
    with pytest.raises(ConfigurationError, match=r"must be one of \('gpipe', '1f1b', "
                                                 r"'interleaved_1f1b'\), or an order"):
        tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=2, schedule="zero_bubble")


REPLICATED = [  # (cuts, micro-batches, batch size): 2 replicas x 2 stages on 4 devices
    (["h2"], 3, 8),   # 4 rows per replica (last batch: 3 + 3): micro-batches 2, 1, 1 / 1, 1, 1
    (["h2"], 4, 5),   # 3 + 2 rows: empty micro-batches in both pipelines
    (["h2"], 2, 1),   # batches of 1 row: the second replica has none
]


def _replicated(replicas: int = 2, optimizer=None):
    """The MLP built in the scope of MirroredStrategy over ``replicas`` of
    the 4 logical CPUs (the others hold the later stages), and the strategy."""
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        return _model(optimizer=optimizer), strategy


@pytest.mark.parametrize("schedule", short_form.only(ONE_STAGE_PER_DEVICE, in_ci=("1f1b",)))
@pytest.mark.parametrize("cuts,micro_batches,batch_size", REPLICATED,
                         ids=[f"2x{len(c) + 1}-m{m}-b{b}" for c, m, b in REPLICATED])
def test_a_pipeline_per_replica_equals_one_device(schedule, cuts, micro_batches, batch_size):
    """Data x pipeline under MirroredStrategy: each replica runs its rows'
    micro-batches through its own stages, each stage's weights and state
    on that replica's device for it, every gradient summed over the
    replica's micro-batches there and all-reduced once."""
    expected = _fit(_model(), batch_size)
    pipeline = tfdist.parallel.Pipeline(cuts=cuts, micro_batches=micro_batches,
                                        schedule=schedule)
    model, strategy = _replicated()
    model = tfdist.attach(model, strategy, parallel=pipeline)
    _assert_equal_to(expected, _fit(model, batch_size))
    assert pipeline.ordering_edges >= len(cuts) + 1
    # Replica r's stage s on CPU s * 2 + r: stage 0 on the replica's own device.
    for layer, stage in (("h1", 0), ("h2", 0), ("h3", 1), ("out", 1)):
        for weight in model.get_layer(layer).weights:
            copies = [tf.DeviceSpec.from_string(c.device).device_index
                      for c in weight.value.values]
            assert copies == [2 * stage, 2 * stage + 1], (weight.path, copies)
    moments = [v for v in model.optimizer.variables if "h3_kernel" in v.path]
    assert [[c.device[-5:] for c in v.value.values] for v in moments] == [["CPU:2", "CPU:3"]] * 2
    graph = _traced_replica_step(model, strategy, batch_size)
    # Every matrix product runs on its replica's stage device: 2 Dense layers
    # per stage, 3 products each per micro-batch.
    products = [tf.DeviceSpec.from_string(op.device).device_index
                for op in graph.get_operations() if op.type == "MatMul"]
    per_device = [products.count(index) for index in range(4)]
    assert per_device == [2 * 3 * micro_batches] * 4, per_device
    # Each weight's gradient is a running sum over the replica's m micro-batches
    # on the weight's copy's device: m - 1 additions for each of a stage's 4
    # weights; on the first stage one more, h1's kernel regularizer's share.
    additions = [tf.DeviceSpec.from_string(op.device).device_index
                 for op in graph.get_operations()
                 if "micro_batch_gradient_sum" in op.name and op.type == "AddV2"]
    per_stage = 4 * (micro_batches - 1)
    assert [additions.count(d) for d in range(4)] == [per_stage + 1] * 2 + [per_stage] * 2


def test_a_pipeline_per_replica_reduces_each_gradient_once_and_reads_no_weight_elsewhere():
    """What crosses devices in one traced step of 2 replicas x 2 stages,
    against the same step without a pipeline. Collectives: per replica one
    count (the global batch's examples) and the gradients, every element
    once, packed by the strategy's all-reduce into one collective per
    device the gradients are on (one per stage; one without a pipeline).
    Between a replica's stages: each micro-batch's activations, their
    gradients, its rows' mask, targets, sample weights and outputs (tensors
    of the micro-batch's rows), scalars, and the later stage's summed gradients, to the
    replica's device for the all-reduce and back; never a weight's value,
    nothing between replicas but the collectives."""
    micro_batches, rows = 4, 8
    for layout in ("data", "data_x_pipeline"):
        model, strategy = _replicated(optimizer=lambda: keras.optimizers.SGD(0.1))
        pipeline = (tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=micro_batches)
                    if layout == "data_x_pipeline" else None)
        model = tfdist.attach(model, strategy, parallel=pipeline)
        _fit(model, batch_size=rows, epochs=1)
        graph = _traced_replica_step(model, strategy, rows)
        reductions = [op for op in graph.get_operations() if op.type.startswith("Collective")]
        assert {op.type for op in reductions} == {"CollectiveReduceV2"}, reductions
        parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        for replica in (0, 1):
            sizes = [int(np.prod(op.inputs[0].shape)) for op in reductions
                     if tf.DeviceSpec.from_string(op.device).device_index == replica]
            gradients = [size for size in sizes if size > 2]
            assert len(sizes) - len(gradients) == 1, (layout, sizes)  # (the count)
            assert sum(gradients) == parameters, (layout, sizes)
            assert len(gradients) == (2 if pipeline else 1), (layout, sizes)
    crossings = device_traffic.crossings(graph)

    def pair(crossing):
        return (tf.DeviceSpec.from_string(crossing.source).device_index,
                tf.DeviceSpec.from_string(crossing.destination).device_index)

    # Replica r: CPU r and CPU 2 + r; between replicas only scalars (the
    # optimizer's iteration count, which the strategy keeps on one device).
    assert {pair(c) for c in crossings if c.shape} == {(0, 2), (2, 0), (1, 3), (3, 1)}, [
        c for c in crossings if c.shape and pair(c) in {(0, 1), (1, 0)}]
    later = {tuple(w.shape) for w in model.get_layer("h3").weights + model.get_layer(
        "out").weights}
    micro_rows = rows // micro_batches  # (no weight has a dimension of 2)
    per_row = [c for c in crossings if c.shape and c.shape[0] == micro_rows]
    # Per replica and micro-batch: the cut's activations and their gradient,
    # the rows' mask, targets and sample weights to the loss on the last
    # stage, its outputs back for the metrics.
    assert len(per_row) == 2 * micro_batches * 6, per_row
    static = [c for c in crossings if c.shape and c.shape[0] != micro_rows]
    # The later stage's 4 gradients, to the replica's device and back, per replica.
    assert sorted(c.shape for c in static) == sorted(
        [shape for shape in later for _ in range(2 * 2)]), static
    reads = [c for c in crossings if "ReadVariableOp" in c.tensor and c.shape]
    assert not reads, reads  # (a weight's value; scalars: the learning rate, the iteration)


def _traced_replica_step(model, strategy, rows: int) -> tf.Graph:
    """The graph of the tfdist training step (each replica's, through
    ``strategy.run``) on ``rows`` rows per replica, traced, not run (after
    a ``fit``, which built the model's Trainer and optimizer)."""
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    x, y, w = ref.classification_arrays(rows)
    batch = strategy.experimental_distribute_values_from_function(
        lambda _: tfdist.Batch(tf.constant(x), tf.constant(y), tf.constant(w)).to_structure())
    step = tf.function(lambda structure: strategy.run(steps.train, args=(structure,)))
    return step.get_concrete_function(batch).graph


@pytest.mark.parametrize("optimizer", UPDATE_FORMS, ids=lambda f: f.__name__[1:])
def test_decay_clipping_and_update_per_stage_equal_one_device(optimizer):
    """AdamW's weight decay, a global norm's and each gradient's norm's
    clipping, and the update run per stage, on its device
    (`tfdist.parallel.stage_updates`): one device's update."""
    expected = _fit(_model(optimizer=optimizer))
    pipeline = tfdist.parallel.Pipeline(cuts=["h1", "h3"], micro_batches=3)
    _assert_equal_to(expected, _fit(tfdist.attach(_model(optimizer=optimizer),
                                                  parallel=pipeline)))


def test_a_skip_connection_across_cuts_equals_one_device():
    """The first stage's output feeds the second and the third: its gradient
    is the sum of both, added on its own device."""
    expected = _fit(_model(skip=True))
    pipeline = tfdist.parallel.Pipeline(cuts=["h1", "h2"], micro_batches=4)
    _assert_equal_to(expected, _fit(tfdist.attach(_model(skip=True), parallel=pipeline)))


def test_each_stages_weights_state_and_ops_are_on_its_device():
    pipeline = tfdist.parallel.Pipeline(cuts=["h1", "h3"], micro_batches=2)
    model = tfdist.attach(_model(), parallel=pipeline)
    _fit(model, epochs=1)
    stage_of_layer = {"h1": 0, "h2": 1, "h3": 1, "out": 2}
    placed = {}
    for layer in model.layers:
        for weight in layer.weights:
            placed[weight.path] = tf.DeviceSpec.from_string(weight.value.device).device_index
            assert placed[weight.path] == stage_of_layer[layer.name], weight.path
    # Adam's moments live with their weights (Keras makes them beside each value).
    checked = 0
    for variable in model.optimizer.variables:
        layer = variable.path.split("/")[-1].split("_")[0]
        if layer in stage_of_layer:
            index = tf.DeviceSpec.from_string(variable.value.device).device_index
            assert index == stage_of_layer[layer], (variable.path, variable.value.device)
            checked += 1
    assert checked == 2 * len(model.trainable_weights), [v.path for v in model.optimizer.variables]
    # Every matrix product of the step (forward, and both of each backward) runs on
    # its stage's device: per micro-batch, 3 per Dense layer.
    graph = _traced_step_graph(pipeline, model)
    products = [op.device for op in graph.get_operations() if op.type == "MatMul"]
    by_stage = [sum(tf.DeviceSpec.from_string(d).device_index == s for d in products)
                for s in range(3)]
    assert by_stage == [3 * 1 * 2, 3 * 2 * 2, 3 * 1 * 2], products


@pytest.mark.parametrize("optimizer", [None] + UPDATE_FORMS,
                         ids=lambda f: "adam" if f is None else f.__name__[1:])
def test_only_each_cuts_activations_and_their_gradients_cross_stages(optimizer):
    """The step's traffic between stages, its update included: each
    micro-batch's activations at each cut, forward, and their gradient,
    backward (a tensor of the cut's width per row), per-row or scalar
    pieces of the loss, and the optimizer's scalars; never a weight, its
    state or a weight-sized gradient. It found two: the first stage's
    kernel regularizer was computed, and its gradient added to the
    kernel's, on the last stage, once per micro-batch
    (`tfdist._internal.keras.weight_regularizers`); and Adam updated every
    stage's weights on the first stage, as AdamW decayed them, Keras
    clipped their gradients and applied their constraints
    (`tfdist.parallel.stage_updates`)."""
    micro_batches, rows, width = 2, 4, 8  # (the traced batch: 8 rows)
    pipeline = tfdist.parallel.Pipeline(cuts=["h1", "h3"], micro_batches=micro_batches)
    model = tfdist.attach(_model(optimizer=optimizer), parallel=pipeline)  # (h1: L2)
    _fit(model, epochs=1)
    crossings = device_traffic.crossings(_traced_step_graph(pipeline, model, update=True),
                                         default_device="/cpu:0")
    shapes = [(c.tensor, list(c.shape)) for c in crossings]
    assert all(len(shape) == 0 or shape[0] == rows for _, shape in shapes), shapes
    weight_shapes = [w.shape for w in model.weights if len(w.shape) > 0]
    assert rows not in {shape[0] for shape in weight_shapes}  # (the test could tell them apart)
    # 2 cuts x m micro-batches x (activations forward + their gradient backward).
    assert sum(shape == [rows, width] for _, shape in shapes) == 2 * micro_batches * 2, shapes


def _traced_step_graph(pipeline, model, update: bool = False):
    """The graph of a pipelined step's forward and backward passes on 8
    rows (traced, not run); ``update``: and the optimizer's update."""
    from tfdist.parallel.plan import ModelPlan  # pylint: disable=import-outside-toplevel
    from tfdist.replica.step import forward_backward  # pylint: disable=import-outside-toplevel

    x, y, w = ref.classification_arrays(8)

    @tf.function
    def step():
        batch = tfdist.Batch(tf.constant(x), tf.constant(y), tf.constant(w))
        gradients = ModelPlan(pipeline).forward_backward(
            model, batch, tf.constant(8.0), whole=None, micro_batch=forward_backward).gradients
        if not update:
            return gradients
        model.optimizer.apply(gradients, model.trainable_variables)
        return None  # (returned, the gradients would go to the step's device)

    return step.get_concrete_function().graph


def test_batch_normalization_is_named_as_seeing_micro_batches():
    keras.utils.set_random_seed(1)
    model = ref.compile_model(ref.build_mlp(batch_norm=True), "sgd")
    pipeline = tfdist.parallel.Pipeline(cuts=[model.layers[0].name], micro_batches=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tfdist.attach(model, parallel=pipeline).fit(
            *ref.classification_arrays(8)[:2], batch_size=8, verbose=0)
    messages = [str(w.message) for w in caught]
    assert any("normalize each micro-batch by its own statistics" in m for m in messages)
    # Its statistics' updates are ordered by TensorFlow, in trace order: the
    # second forward pass cannot also wait for the first, and the warning says so.
    unordered = [m for m in messages if "order is not enforced everywhere" in m]
    assert len(unordered) == 1 and "stage 0 at F1" in unordered[0], messages


def test_what_a_pipeline_cannot_do_yet_is_refused_naming_it(make_strategy):
    x, y, _ = ref.classification_arrays(8)
    with pytest.raises(ConfigurationError,
                       match=r"no layer at path 'h9'; the model's layers are \['h1', 'h2'"):
        tfdist.attach(_model(), parallel=tfdist.parallel.Pipeline(cuts=["h9"], micro_batches=2)
                      ).fit(x, y, verbose=0)
    with pytest.raises(ConfigurationError, match="not its last layer"):
        tfdist.attach(_model(), parallel=tfdist.parallel.Pipeline(cuts=["out"], micro_batches=2)
                      ).fit(x, y, verbose=0)
    with pytest.raises(ConfigurationError, match="must be a positive integer"):
        tfdist.parallel.Pipeline(cuts=["h1"], micro_batches=0)
    with pytest.raises(ConfigurationError, match=r"Pipeline\(replicas=2\) is retired: .*"
                                                 r"num_replicas=d\), parallel=Pipeline"):
        tfdist.parallel.Pipeline(cuts=["h1"], micro_batches=2, replicas=2)
    strategy = make_strategy(2)
    with strategy.scope():
        replicated = _model()
    with pytest.raises(ConfigurationError, match=r"2 replicas x 3 stages need 6 CPU devices, "
                                                 r"4 beside .*configure_logical_cpus\(6\)"):
        tfdist.attach(replicated, strategy,
                      parallel=tfdist.parallel.Pipeline(cuts=["h1", "h2"], micro_batches=2)
                      ).fit(x, y, verbose=0)
    with pytest.raises(ConfigurationError, match="with communication=.* is not built yet"):
        tfdist.Trainer(_model(), tf.distribute.get_strategy(),
                       communication=tfdist.communication.Compression("bf16"),
                       parallel=tfdist.parallel.Pipeline(cuts=["h1"], micro_batches=2))


def test_a_loss_whose_denominator_depends_on_the_data_is_refused():
    """A Keras mask at the output: each micro-batch's loss would need the
    batch's count of unmasked time steps before the others ran."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True, name="embed")(inputs)
    outputs = keras.layers.Dense(2, name="tag")(embedded)  # (the mask reaches the output)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    ids = np.array([[1, 2, 0, 0], [3, 0, 0, 0]], "int32")
    with pytest.raises(ConfigurationError, match="Pipeline .* supports losses without Keras masks"):
        tfdist.attach(model, parallel=tfdist.parallel.Pipeline(cuts=["embed"], micro_batches=2)
                      ).fit(ids, np.zeros((2, 4), "int64"), verbose=0)


class PenalizedModel(keras.Model):
    """A compute_loss override adding a mean of its own (the zoo's
    ``own_compute_loss`` trains it against one device)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.1 * tf.reduce_mean(tf.square(tf.nest.flatten(y_pred)[0]))


def _penalized(outputs_of, loss, *, dtype="float32"):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,), dtype=dtype)
    model = PenalizedModel(inputs, outputs_of(inputs))
    model.compile(optimizer="sgd", loss=loss)
    return model


def test_an_own_compute_loss_under_a_pipeline_per_replica_equals_one_device():
    """The override's value per micro-batch, weighted by its rows' share of
    the whole batch (both replicas'), sums to one device's loss."""
    def build():
        return _penalized(lambda i: keras.layers.Dense(1, name="out")(
            keras.layers.Dense(6, "tanh", name="cut")(i)), "mse")

    x = np.random.default_rng(0).random((21, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def fit(model):
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        return model.get_weights(), history, model.evaluate(x, y, batch_size=8, verbose=0)

    weights, history, evaluation = fit(build())
    pipeline = tfdist.parallel.Pipeline(cuts=["cut"], micro_batches=3)
    strategy = tfdist.make_strategy("mirrored", num_replicas=2)
    with strategy.scope():
        model = build()
    got_weights, got_history, got_evaluation = fit(tfdist.attach(model, strategy,
                                                                 parallel=pipeline))
    ref.assert_weight_lists_close(weights, got_weights)
    ref.assert_logs_close(history, got_history)
    np.testing.assert_allclose(got_evaluation, evaluation, rtol=1e-5)


@pytest.mark.parametrize("outputs_of,loss,data,message", [
    (lambda i: keras.layers.Dense(1, name="out")(keras.layers.Dense(3, name="cut")(i)),
     keras.losses.MeanSquaredError(reduction="sum"), "features",
     r"reduced by \['sum'\]"),
    (lambda i: [keras.layers.Dense(1, name="a")(keras.layers.Dense(3, name="cut")(i)),
                keras.layers.Dense(1, name="b")(i)],
     ["mse", "mse"], "two_targets", r"2 compiled losses \(one per output\)"),
    (lambda i: keras.layers.Dense(2, name="tag")(
        keras.layers.Embedding(10, 4, mask_zero=True, name="cut")(i)),
     keras.losses.SparseCategoricalCrossentropy(from_logits=True), "ids",
     r"output carries a Keras mask"),
], ids=["sum_reduction", "multi_output", "mask_at_output"])
def test_an_own_compute_loss_that_micro_batches_cannot_add_up_is_refused(
        outputs_of, loss, data, message):
    x = np.ones((4, 4), "float32")
    arrays = {"features": (x, np.ones((4, 1))),
              "two_targets": (x, (np.ones((4, 1)), np.ones((4, 1)))),
              "ids": (np.array([[1, 2, 0, 0]] * 4, "int32"), np.zeros((4, 4), "int64"))}[data]
    model = _penalized(outputs_of, loss, dtype="int32" if data == "ids" else "float32")
    pipeline = tfdist.parallel.Pipeline(cuts=["cut"], micro_batches=2)
    with pytest.raises(ConfigurationError, match="cannot run this model's own compute_loss "
                                                 f"on micro-batches: .*{message}"):
        tfdist.attach(model, parallel=pipeline).fit(*arrays, batch_size=4, verbose=0)


def test_jit_compile_runs_without_xla_and_says_so():
    model = _model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tfdist.attach(model, parallel=tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=2)
                      ).fit(*ref.classification_arrays(8)[:2], verbose=0)
    assert any("cannot span" in str(w.message) for w in caught)


class _PositionEmbedding(keras.layers.Layer):
    """Adds a learnt embedding of each position (looked up with
    ``ops.arange``: every micro-batch looks up the same ids)."""

    def __init__(self, length, width, **kwargs):
        super().__init__(**kwargs)
        self.positions = keras.layers.Embedding(length, width)

    def call(self, x):
        return x + self.positions(keras.ops.arange(keras.ops.shape(x)[1]))


def _text_model(regularized: bool = False):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6,), dtype="int32")
    tokens = keras.layers.Embedding(
        20, 8, name="tokens",
        embeddings_regularizer=keras.regularizers.L2(0.01) if regularized else None)(inputs)
    placed = _PositionEmbedding(6, 8, name="positions")(tokens)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(placed)
    outputs = keras.layers.Dense(ref.NUM_CLASSES, "softmax", name="out")(pooled)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.mark.parametrize("regularized", [False, True], ids=["plain", "regularized"])
def test_embeddings_sparse_gradients_keep_one_devices_form_under_adam(regularized):
    """Adam squares a sparse gradient's entries before duplicate ids are
    summed, so one device's result depends on the gradient's form: token
    lookups' entries are concatenated over the micro-batches, the position
    lookup every micro-batch makes whole is summed (as over replicas).
    ``regularized``: the token table's L2 gradient is dense, and one
    device's tape adds it to the lookups' to a dense gradient: so does
    the pipeline, once per step on the table's device."""
    rng = np.random.default_rng(0)
    ids, labels = rng.integers(1, 20, (30, 6)).astype("int32"), rng.integers(0, 3, 30)

    def fit(model):
        history = model.fit(ids, labels, batch_size=10, epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), history.history

    weights, history = fit(_text_model(regularized))
    pipeline = tfdist.parallel.Pipeline(cuts=["positions"], micro_batches=3)
    got_weights, got_history = fit(tfdist.attach(_text_model(regularized), parallel=pipeline))
    ref.assert_weight_lists_close(weights, got_weights)
    ref.assert_logs_close(history, got_history)


class _Recorder(keras.layers.Layer):
    """Keeps the rows of each call in training (one slot per call, in the
    order the step runs them: a pipeline's micro-batches)."""

    def __init__(self, calls, rows, **kwargs):
        super().__init__(**kwargs)
        self.slots = (calls, rows)

    def build(self, input_shape):
        self.seen = tf.Variable(tf.zeros(self.slots + (input_shape[-1],)), trainable=False)
        self.calls = tf.Variable(0, trainable=False)

    def call(self, inputs, training=False):
        if training:
            self.seen.scatter_nd_update([[self.calls % self.slots[0]]], inputs[None])
            self.calls.assign_add(1)
        return inputs


def _dropout_model(recorded: bool = False):
    """Dense, Dropout, (a `_Recorder` of 2 calls of 2 rows,) Dense."""
    keras.utils.set_random_seed(2)
    recorder = [_Recorder(2, 2, name="seen")] if recorded else []
    model = keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(16, "relu", name="first"),
        keras.layers.Dropout(0.5, seed=7, name="drop"), *recorder,
        keras.layers.Dense(ref.NUM_CLASSES, "softmax", name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def test_each_micro_batch_draws_its_own_random_values():
    """Dropout in a later stage: two micro-batches of the same rows get
    different masks (the seed generator moves on at every call), and the
    same run draws the same values again."""
    x, y = np.ones((4, 6), "float32"), np.zeros((4,), "int64")
    seen = []
    for _ in range(2):
        model = tfdist.attach(_dropout_model(recorded=True), parallel=tfdist.parallel.Pipeline(
            cuts=["first"], micro_batches=2))
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        seen.append(model.get_layer("seen").seen.numpy())
    first, second = seen[0]  # (each: the 2 rows of one micro-batch, the same inputs)
    assert np.any((first == 0) != (second == 0)), "two micro-batches drew the same mask"
    np.testing.assert_array_equal(seen[0], seen[1])


def test_a_resumed_pipeline_draws_what_the_uninterrupted_one_draws(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.randn(40, 6).astype("float32")
    y = (x[:, 0] > 0).astype("int64")

    def run(directory, first_epochs, seed_offset=0):
        for epochs in (first_epochs, 3):
            model = _dropout_model()
            if seed_offset:
                model.get_layer("drop").seed_generator.state.assign([seed_offset, 0])
            tfdist.Trainer(model, tf.distribute.get_strategy(),
                           checkpointing=tfdist.CheckpointOptions(str(directory)),
                           parallel=tfdist.parallel.Pipeline(cuts=["first"], micro_batches=3)
                           ).fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
                                 epochs=epochs, verbose=0)
        return model.get_weights()

    uninterrupted = run(tmp_path / "whole", 3)
    ref.assert_weight_lists_close(uninterrupted, run(tmp_path / "resumed", 1))
    other = run(tmp_path / "other", 3, seed_offset=99)
    assert max(float(np.abs(a - b).max()) for a, b in zip(uninterrupted, other)) > 1e-3


@pytest.mark.parametrize("first,then", [
    pytest.param("pipeline", "none", marks=pytest.mark.full_form),
    pytest.param("none", "pipeline", marks=pytest.mark.full_form),
    ("pipeline", "pipeline_2x2"),
    ("fully_sharded_2x2", "none"),
    pytest.param("none", "fully_sharded_2x2", marks=pytest.mark.full_form)])
def test_a_checkpoint_resumes_under_any_layout_and_saves_for_plain_keras(tmp_path, first, then):
    """A run checkpointed under one layout (a pipeline of 3 stages, none,
    2 pipelines of 2, 2 pipelines of 2 with each stage fully sharded over
    the 2 replicas) and finished under another ends at one device's
    weights after the same epochs (Adam's state restored across layouts);
    ``model.save`` of the pipelined model loads with plain
    ``keras.models.load_model`` and predicts the same."""
    x, y, w = ref.classification_arrays(EXAMPLES)
    data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(8)
    expected = _model()
    expected.fit(data, epochs=3, verbose=0)
    layouts = {"none": None,
               "pipeline": tfdist.parallel.Pipeline(cuts=["h1", "h3"], micro_batches=3),
               "pipeline_2x2": tfdist.parallel.Pipeline(cuts=["h2"], micro_batches=2)}
    layouts["fully_sharded_2x2"] = layouts["pipeline_2x2"]
    for layout, epochs in ((first, 1), (then, 3)):
        strategy = (tfdist.make_strategy("mirrored", num_replicas=2)
                    if layout.endswith("2x2") else tf.distribute.get_strategy())
        with strategy.scope():
            model = _model()
        tfdist.Trainer(model, strategy, parallel=layouts[layout],
                       communication=(tfdist.communication.FullySharded()
                                      if layout.startswith("fully_sharded") else None),
                       checkpointing=tfdist.CheckpointOptions(str(tmp_path / "ckpt"))).fit(
            data, epochs=epochs, verbose=0)
    ref.assert_weight_lists_close(expected.get_weights(), model.get_weights())
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected.predict(x, verbose=0),
                               atol=1e-5, rtol=0)
