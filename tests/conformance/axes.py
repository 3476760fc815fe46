"""The conformance axes beyond model families: optimizers on every sparse
gradient pattern (with and without sharded optimizer state), loss forms,
metric forms and model forms, each value a `tests.conformance.zoo.Case`
that the harness runs against single-device Keras. (Input containers have
their own harness: `tests.conformance.containers`.)

Why these axes: programs written by other people vary along them, and a
bug along one of them leaves every model family passing. Keras 3's sparse
optimizers, for one, update from an ``IndexedSlices`` gradient entry by
entry (Adam squares each entry before duplicate rows are summed), so where
a lookup's ids come from (each row's tokens, positions every replica looks
up whole, one table looked up twice) changes one device's result, and N
replicas must reproduce it (`tfdist._internal.sparse_gradients`).
"""

import keras
import numpy as np
import tensorflow as tf

from conformance import zoo
from conformance.corpus.knowledge_distillation import Distiller
from conformance.zoo import CLASSES, SEQUENCE, VOCABULARY, Case

# -- optimizers x sparse gradient patterns ------------------------------------

OPTIMIZERS = {
    "sgd": lambda **clip: keras.optimizers.SGD(0.1, **clip),
    "momentum": lambda **clip: keras.optimizers.SGD(0.1, momentum=0.9, **clip),
    "adam": lambda **clip: keras.optimizers.Adam(0.01, **clip),
    "adamw": lambda **clip: keras.optimizers.AdamW(0.01, weight_decay=0.01, **clip),
    "rmsprop": lambda **clip: keras.optimizers.RMSprop(0.01, **clip),
    "adagrad": lambda **clip: keras.optimizers.Adagrad(0.1, **clip),
    "adamax": lambda **clip: keras.optimizers.Adamax(0.01, **clip),
    "lion": lambda **clip: keras.optimizers.Lion(0.001, **clip),
    "loss_scale_adam": lambda **clip: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01, **clip)),
}


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras.io's "Text classification with Transformer" embedding: token
    ids looked up per row, positions (``ops.arange``) looked up whole by
    every replica. ``tied``: one table for both (the same table's gradient
    then sums a lookup of each kind)."""

    def __init__(self, tied=False, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(VOCABULARY, 8)
        self.pos_emb = self.token_emb if tied else keras.layers.Embedding(SEQUENCE, 8)

    def call(self, x):
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.token_emb(x) + self.pos_emb(positions)


def _pooled(embedding, length=SEQUENCE):
    def build():
        return keras.Sequential([
            keras.Input((length,), dtype="int32"), embedding(),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(CLASSES, activation="softmax")])
    return build


def padded_sequences_counted(examples: int, batch: int) -> tf.data.Dataset:
    """`zoo.padded_sequences` with its number of batches known to tf.data.

    Keras 3.15 counts one optimizer iteration more per epoch than it runs
    on data of unknown length (2 epochs of 3 batches: ``iterations`` 8,
    6 with the length known), which shifts Adam's bias correction; tfdist
    counts the steps it runs. (Docs: Semantics.)
    """
    return zoo.padded_sequences(examples, batch).apply(
        tf.data.experimental.assert_cardinality(-(-examples // batch)))


# pattern -> (build, dataset, clipping[, XLA])
SPARSE_PATTERNS = {
    "dense": (zoo.mlp(), zoo.features, {}),
    "tokens": (_pooled(lambda: keras.layers.Embedding(VOCABULARY, 8)), zoo.tokens, {}),
    "positions": (_pooled(TokenAndPositionEmbedding), zoo.tokens, {}),
    # Batches padded to their longest sequence: the positions' count is read
    # from the batch's shape when the step runs.
    "positions_variable_length": (_pooled(TokenAndPositionEmbedding, length=None),
                                  padded_sequences_counted, {}),
    "tokens_and_positions_one_table": (
        _pooled(lambda: TokenAndPositionEmbedding(tied=True)), zoo.tokens, {}),
    "one_table_twice": (zoo.tied_embedding, zoo.pairs, {}),
    # Active on most batches: the clip sees the whole batch's gradient (a
    # LossScaleOptimizer's inner optimizer clips it with the scale divided out).
    "dense_global_clipnorm": (zoo.mlp(), zoo.features, {"global_clipnorm": 0.05}),
    "tokens_global_clipnorm": (_pooled(lambda: keras.layers.Embedding(VOCABULARY, 8)),
                               zoo.tokens, {"global_clipnorm": 0.05}),
    # The forward and backward pass compiled as one XLA function (the
    # lookups' ids are followed into it).
    "positions_under_xla": (_pooled(TokenAndPositionEmbedding), zoo.tokens, {}, True),
}


def optimizer_case(optimizer: str, pattern: str) -> Case:
    """The optimizer axis compares what the optimizer changes: the weights on
    every replica and the training history. `evaluate` and `predict` never
    run the optimizer (the other axes and the zoo compare them), so these
    cases leave them out."""
    build, dataset, clipping, *xla = SPARSE_PATTERNS[pattern]

    def compile_model(model):
        model.compile(optimizer=OPTIMIZERS[optimizer](**clipping), jit_compile=bool(xla),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    return Case(f"{optimizer}-{pattern}", zoo._seeded(build), compile_model, dataset,
                predicts=False)


# -- loss forms ---------------------------------------------------------------

def _per_example_function(y_true, y_pred):
    """A plain function returning one value per example (Keras wraps it)."""
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


def _scalar_function(y_true, y_pred):
    """A function returning the batch's mean, as published examples write
    their custom losses (``return ops.mean(...)``)."""
    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y_true, y_pred))


def tagging_model():
    """Sequence labelling: a masked embedding, an LSTM per time step and a
    per-time-step softmax; the mask reaches the output (loss and metrics).

    Keras 3.16 stopped passing a mask on from recurrent layers
    (keras-team/keras#23235: they still read it, their outputs carry none);
    setting ``supports_masking`` passes it on again, as Keras 3.15 did, so
    the loss and metrics see the mask on every supported Keras."""
    recurrent = keras.layers.LSTM(6, return_sequences=True)
    recurrent.supports_masking = True
    return keras.Sequential([
        keras.Input((None,), dtype="int32"),
        keras.layers.Embedding(VOCABULARY, 8, mask_zero=True),
        recurrent,
        keras.layers.Dense(CLASSES, activation="softmax")])


def tagged_sequences(examples: int, batch: int, weighted: bool = False) -> tf.data.Dataset:
    """Sequences of 2..SEQUENCE ids, zero-padded to SEQUENCE, with a class per
    time step (padding steps labelled 0, masked); ``weighted``: a weight per
    time step (Keras' temporal sample weights: with a mask at the output,
    Keras 3 itself fails on one weight per example, shapes [B] and [B, T])."""
    rng = np.random.RandomState(0)
    x = np.zeros((examples, SEQUENCE), "int32")
    for row, length in enumerate(rng.randint(2, SEQUENCE + 1, size=examples)):
        x[row, :length] = rng.randint(1, VOCABULARY, size=length)
    y = np.where(x > 0, (x + np.roll(x, 1, axis=1)) % CLASSES, 0).astype("int64")
    parts = (x, y)
    if weighted:
        weights = rng.uniform(0.2, 2.0, examples).astype("float32")
        parts += (np.repeat(weights[:, None], SEQUENCE, axis=1),)
    return tf.data.Dataset.from_tensor_slices(parts).batch(batch)


def two_outputs():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, [
        keras.layers.Dense(CLASSES, activation="softmax", name="label")(hidden),
        keras.layers.Dense(1, name="score")(hidden)])


def two_targets(examples: int, batch: int) -> tf.data.Dataset:
    x, y = zoo._feature_arrays(examples)
    score = (x[:, :1] * 0.5 - x[:, 1:2]).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, (y, score))).batch(batch)


def _loss_case(name, loss, build=zoo.mlp(), dataset=zoo.features, axis="loss",
               **compile_options):
    def compile_model(model):
        # Metric objects made per compile (``metrics=lambda: [...]``), inside the
        # strategy's scope as users write it: one made at import would carry its
        # state from model to model (Keras 3 keeps it in the object), and
        # across workers it is refused.
        options = {key: value() if key.endswith("metrics") and callable(value) else value
                   for key, value in compile_options.items()}
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss, **options)
    return Case(f"{axis}-{name}", zoo._seeded(build), compile_model, dataset)


LOSS_FORMS = (
    _loss_case("string", "sparse_categorical_crossentropy", metrics=["accuracy"]),
    _loss_case("instance", keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"]),
    _loss_case("per_example_function", _per_example_function, metrics=["accuracy"]),
    _loss_case("scalar_function", _scalar_function, metrics=["accuracy"]),
    _loss_case("masked_per_timestep", "sparse_categorical_crossentropy", tagging_model,
               tagged_sequences),
    _loss_case("sample_weight_with_mask", "sparse_categorical_crossentropy", tagging_model,
               lambda examples, batch: tagged_sequences(examples, batch, weighted=True),
               weighted_metrics=["sparse_categorical_accuracy"]),
    _loss_case("list", ["sparse_categorical_crossentropy", "mse"], two_outputs, two_targets,
               loss_weights=[1.0, 0.5]),
    _loss_case("dict", {"label": "sparse_categorical_crossentropy", "score": "mse"},
               zoo.dict_model, zoo.dict_features, loss_weights={"label": 1.0, "score": 0.5}),
)

# -- metric forms ---------------------------------------------------------------

METRIC_FORMS = (
    _loss_case("mask_at_output", "sparse_categorical_crossentropy", tagging_model,
               tagged_sequences, axis="metric",
               metrics=lambda: ["sparse_categorical_accuracy",
                                keras.metrics.SparseTopKCategoricalAccuracy(2, name="top2")]),
    _loss_case("sample_weight", "sparse_categorical_crossentropy",
               dataset=zoo.weighted_features, axis="metric", metrics=["accuracy"],
               weighted_metrics=lambda: ["accuracy", keras.metrics.SparseCategoricalCrossentropy(
                   name="weighted_ce")]),
    Case("metric-own_trackers", zoo._seeded(zoo.own_metrics_model),
         lambda m: m.compile(optimizer=keras.optimizers.SGD(0.05)), zoo.regression,
         trainer=False, evaluates=False),
)

# -- model forms ----------------------------------------------------------------


class Subclassed(keras.Model):
    """A subclassed model with its own ``call``."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def functional():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(hidden))


def nested():
    """A functional model around a Sequential block around a layer."""
    block = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu")],
                             name="block")
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(block(inputs)))


def distiller():
    """keras.io's "Knowledge distillation" (`conformance.corpus.knowledge_distillation`):
    no ``call()``, its own ``compile`` and ``train_step``, compiled metrics."""
    teacher = keras.Sequential([keras.Input((6,)), keras.layers.Dense(CLASSES)], name="teacher")
    student = keras.Sequential([keras.Input((6,)), keras.layers.Dense(CLASSES)], name="student")
    return Distiller(student, teacher)


def _compile_distiller(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()],
                  student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  distillation_loss_fn=keras.losses.KLDivergence(), alpha=0.5, temperature=2.0)


def subclassed():
    model = Subclassed()
    model.build((None, 6))
    return model


def _model_case(name, build):
    return _loss_case(name, "sparse_categorical_crossentropy", build, axis="model",
                      metrics=["accuracy"])


MODEL_FORMS = (
    _model_case("sequential", zoo.mlp()),
    _model_case("functional", functional),
    _model_case("subclassed", subclassed),
    _model_case("nested", nested),
    Case("model-train_step_only_with_compiled_metrics", zoo._seeded(distiller),
         _compile_distiller, zoo.features, trainer=False, predicts=False),
)

FORMS = {case.name: case for case in LOSS_FORMS + METRIC_FORMS + MODEL_FORMS}


def case_named(name: str) -> Case:
    """An axis case by its name: a form's (`FORMS`), or an optimizer case's
    ``"<optimizer>-<pattern>"`` (`optimizer_case`; a cluster task rebuilds
    its case from the name it is given)."""
    if name in FORMS:
        return FORMS[name]
    optimizer, _, pattern = name.partition("-")
    return optimizer_case(optimizer, pattern)
