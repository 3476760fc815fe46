"""The slow-network benchmarks' workload: tfdist's embedded dataset (16x16
patterns, 10 classes) flattened to 256 features, and a two-hidden-layer MLP
whose width sets the gradients' size (width 2048: 4.7M parameters; 3072:
10.3M). TensorFlow is imported on first use: the scripts' launcher side
never loads it."""


def flat_patterns(split: str, data_dir: str):
    """The ``split`` ("train" / "test") as ``(256 floats in [0, 1], label)``
    examples, unbatched (generated into ``data_dir`` once)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tfdist  # pylint: disable=import-outside-toplevel

    return tfdist.data.load_tfds("synthetic_patterns", split, data_dir=data_dir).map(
        lambda image, label: (tf.cast(tf.reshape(image, [256]), tf.float32) / 255.0, label))


def mlp(width: int):
    """256 -> ``width`` -> ``width`` -> 10 logits (ReLU), uncompiled."""
    import keras  # pylint: disable=import-outside-toplevel

    return keras.Sequential([
        keras.Input((256,)), keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
