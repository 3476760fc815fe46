"""Gradient compression (`tfdist.communication.Compression`): the all-reduce
in 16 bits. Checked against an independent one-device loop that computes
each replica's share of the gradient, rounds it to 16 bits, sums and
applies it: the compressed run must land there, not on the uncompressed
result."""

import keras
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support.models import GuideTrainStep
from tfdist.communication import Compression
from tfdist.errors import ConfigurationError

DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}


def _model():
    model = ref.build_mlp(l2=0.0)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5),
                  loss="sparse_categorical_crossentropy")
    return model


def _one_device(dataset, epochs: int, dtype=None, replicas: int = 2):
    """`sixteen_bit_shares` of this module's model (SGD 0.5) on ``dataset``."""
    return sixteen_bit_shares(_model(), dataset,
                              keras.losses.SparseCategoricalCrossentropy(reduction="sum"),
                              0.5, epochs, dtype, replicas)


def sixteen_bit_shares(model, batches, loss_fn, learning_rate: float, epochs: int, dtype=None,
                       replicas: int = 2) -> list:
    """SGD on one device as tfdist exchanges gradients compressed: each
    batch's gradient is the sum of ``replicas`` contiguous shares (as
    tfdist splits a global batch), each share rounded to ``dtype`` (fp16:
    pre-scaled by 1/replicas) and summed in it. A sparse gradient's
    entries (an Embedding's, one per occurrence) cross unsummed: each is
    rounded and applied, duplicates kept. ``loss_fn`` sums over the
    examples; ``dtype`` None: no rounding. Returns the weights."""
    scale = 1.0 / replicas if dtype == "fp16" else 1.0

    def rounded(value):
        if dtype is None:
            return value
        return tf.cast(tf.cast(value * scale, DTYPES[dtype]), value.dtype) / scale

    for _ in range(epochs):
        for batch in batches:
            x, y, w = batch if len(batch) == 3 else (*batch, None)
            size = int(x.shape[0])
            shares = []
            for r in range(replicas):
                rows = slice(r * size // replicas, (r + 1) * size // replicas)
                with tf.GradientTape() as tape:
                    loss = loss_fn(y[rows], model(x[rows], training=True),
                                   None if w is None else w[rows]) / size
                shares.append(tape.gradient(loss, model.trainable_variables))
            for index, variable in enumerate(model.trainable_variables):
                parts = [share[index] for share in shares]
                if isinstance(parts[0], tf.IndexedSlices):
                    variable.value.scatter_sub(tf.IndexedSlices(
                        learning_rate * rounded(tf.concat([p.values for p in parts], 0)),
                        tf.concat([p.indices for p in parts], 0)))
                    continue
                if dtype is None:
                    total = tf.add_n(parts)
                else:
                    total = tf.cast(tf.add_n([tf.cast(p * scale, DTYPES[dtype]) for p in parts]),
                                    tf.float32) / scale
                variable.assign_sub(learning_rate * total)
    return [w.numpy() for w in model.weights]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_compressed_training_on_2_replicas_equals_16_bit_shares_on_one_device(
        make_strategy, dtype):
    dataset = ref.global_batches(64, 16)
    strategy = make_strategy(2)
    with strategy.scope():
        model = _model()
    tfdist.Trainer(model, strategy, communication=Compression(dtype)).fit(
        dataset, epochs=2, verbose=0)
    compressed = _one_device(dataset, 2, dtype)
    exact = _one_device(dataset, 2)
    to_reference = ref.largest_difference(model.get_weights(), compressed)
    rounding = ref.largest_difference(exact, compressed)
    assert rounding > 1e-5, rounding  # the 16-bit rounding is visible...
    assert to_reference < 1e-5, (to_reference, rounding)  # ...and tfdist does exactly it


def test_a_models_own_train_step_is_compressed_exactly_too(make_strategy):
    """keras.io's train_step (compute_loss, optimizer.apply) under attach:
    the same 16-bit shares (its loss carries Keras' replica factor, which
    the all-reduce takes off)."""
    dataset = ref.global_batches(64, 16, weighted=False)
    strategy = make_strategy(2)
    with strategy.scope():
        base = _model()
        model = GuideTrainStep(base.inputs, base.outputs)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5),
                      loss="sparse_categorical_crossentropy")
    tfdist.attach(model, strategy, communication=Compression("fp16"))
    model.fit(dataset, epochs=2, verbose=0)
    compressed, exact = _one_device(dataset, 2, "fp16"), _one_device(dataset, 2)
    assert ref.largest_difference(exact, compressed) > 1e-5
    assert ref.largest_difference(model.get_weights(), compressed) < 1e-5


def test_attach_takes_compression_and_one_replica_casts_nothing(make_strategy):
    dataset = ref.global_batches(64, 16)
    strategy = make_strategy(1)
    with strategy.scope():
        model = _model()
    tfdist.attach(model, strategy, communication=(Compression("bf16"),)).fit(
        dataset, epochs=2, verbose=0)
    assert ref.largest_difference(model.get_weights(), _one_device(dataset, 2)) < 1e-5


def test_bad_compression_arguments_are_clear_errors(make_strategy):
    with pytest.raises(ConfigurationError, match="must be 'bf16'"):
        Compression("int8")
    strategy = make_strategy(2)
    with strategy.scope():
        model = _model()
    with pytest.raises(ConfigurationError, match="`communication` .* must be a tfdist"):
        tfdist.Trainer(model, strategy, communication="bf16")
    Compression("bf16").attach_to(model.optimizer, strategy)
    with pytest.raises(ConfigurationError, match="already all-reduces with Compression"):
        Compression("fp16").attach_to(model.optimizer, strategy)
