"""Measures the live-tensor peak of a fully sharded step (for
tests/communication/test_fully_sharded.py): a stack of equal Dense layers
on 4 logical CPUs, trained with each `FullySharded` setting in turn, with
TensorFlow's BFC allocator on the CPU (``TF_CPU_ALLOCATOR_USE_BFC``, set
before TensorFlow starts), which counts the bytes of live tensors.

Prints one JSON line: per setting, the peak during ``fit`` above what was
alive before it, in units of one layer's weight per replica.
"""

import json
import os
import pathlib
import sys

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.communication import FullySharded  # noqa: E402

REPLICAS, LAYERS, UNITS, BATCH = 4, 12, 256, 8
# (options, whether the layers sit inside one layer, "stack")
SETTINGS = {"reshard": ({}, False), "reshard_no_prefetch": ({"prefetch": False}, False),
            "keep_gathered": ({"reshard_after_forward": False}, False),
            "nested_one_unit": ({}, True),
            "nested_units": ({"units": [r"stack/layer_\d+"]}, True)}


def peak_in_layers(options: dict, nested: bool) -> float:
    strategy = tfdist.make_strategy("mirrored", num_replicas=REPLICAS)
    with strategy.scope():
        layers = [keras.layers.Dense(UNITS, use_bias=False, name=f"layer_{index}")
                  for index in range(LAYERS)]
        if nested:  # (the stack is one layer of the model: one unit unless `units` opens it)
            layers = [keras.Sequential(layers, name="stack")]
        model = keras.Sequential([keras.Input((UNITS,))] + layers)
        model.compile("sgd", "mse")
    model = tfdist.attach(model, strategy, communication=FullySharded(**options))
    x = np.random.default_rng(0).random((BATCH, UNITS), "float32")
    model.fit(x, x, batch_size=BATCH, verbose=0)  # (traced, built)
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model.fit(x, x, batch_size=BATCH, epochs=2, verbose=0)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return (peak - before) / (UNITS * UNITS * 4) / REPLICAS


def main():
    tfdist.strategies.configure_logical_cpus(REPLICAS)
    print(json.dumps({name: peak_in_layers(*setting) for name, setting in SETTINGS.items()}))


if __name__ == "__main__":
    main()
