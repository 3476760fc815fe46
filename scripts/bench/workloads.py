"""The benchmark's models and data: what every contender trains on.

Data is one constant in-memory global batch repeated forever, so the
training loop is measured, not the input pipeline; each contender runs a
window of ``steps`` steps from a fresh iterator, as an epoch does.
"""

import numpy as np

MODELS = ("mlp", "convnet", "embedding")
IMAGE_SHAPE = (16, 16, 1)
NUM_CLASSES = 10
# The embedding model reads a 16x16 image as 256 tokens of 16 buckets each
# (strategies/recipes.py: pixel_tokens): a 4096 x 16 table.
SEQUENCE_LENGTH = 256
VOCABULARY = SEQUENCE_LENGTH * 16


def global_batch(model: str, batch_size: int):
    """``(x, y)`` NumPy arrays of one global batch for ``model``."""
    rng = np.random.RandomState(0)
    y = rng.randint(0, NUM_CLASSES, batch_size)
    if model == "embedding":
        return rng.randint(0, VOCABULARY, (batch_size, SEQUENCE_LENGTH)).astype("int32"), y
    return rng.rand(batch_size, *IMAGE_SHAPE).astype("float32"), y


def endless_dataset(model: str, batch_size: int):
    """The global batch repeated forever (static batch dimension); without
    tf.data autotuning once `bench.teardown` removed the teardown stall."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from bench import teardown  # pylint: disable=import-outside-toplevel

    dataset = tf.data.Dataset.from_tensors(global_batch(model, batch_size)).repeat()
    return teardown.without_autotune(dataset) if teardown.stall_removed() else dataset


def examples_recipes():
    """strategies/recipes.py: the example programs' data and models."""
    import importlib  # pylint: disable=import-outside-toplevel
    import pathlib  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    examples = str(pathlib.Path(__file__).resolve().parents[2] / "strategies")
    if examples not in sys.path:
        sys.path.append(examples)
    return importlib.import_module("recipes")


def compiled_model(strategy, model: str, steps_per_execution: int):
    """A freshly seeded, compiled ``model`` under ``strategy``'s scope."""
    import keras  # pylint: disable=import-outside-toplevel

    recipes = examples_recipes()

    if model not in MODELS:
        raise ValueError(f"--models: {model!r} is not one of {MODELS}.")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        if model == "embedding":
            built = recipes.build_embedding_model(VOCABULARY, SEQUENCE_LENGTH, NUM_CLASSES)
        else:
            built = recipes.build_model(model, IMAGE_SHAPE, NUM_CLASSES)
        built.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return built
