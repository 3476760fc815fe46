"""What the tutorial tests share (tests/scenarios/tutorials/).

The official distributed-training tutorials, adopted (issue 33, point 7).

Each test holds the user code of one tutorial, on generated data of the same
shapes (`tests.programs.tutorial_mnist_setup.load_data`: uint8 28x28 images,
labels 0-9, a few hundred examples), with tfdist's documented change marked
``# tfdist:``, and compares it with the tutorial's own code on one device
(same data, same order, same initial weights) to 1e-5:

- tensorflow/docs site/en/tutorials/distribute/custom_training.ipynb
- tensorflow/docs site/en/tutorials/distribute/keras.ipynb
- tensorflow/docs site/en/tutorials/distribute/multi_worker_with_keras.ipynb
  (tests/programs/tutorial_multi_worker_keras.py, 2 workers)
- tensorflow/docs site/en/tutorials/distribute/multi_worker_with_ctl.ipynb
  (tests/programs/tutorial_multi_worker_ctl.py, 2 workers)
- tensorflow/docs site/en/tutorials/distribute/parameter_server_training.ipynb
  (tests/programs/tutorial_parameter_server.py, 1 worker + 2 ps)
- tensorflow/docs site/en/tutorials/distribute/save_and_load.ipynb
- keras-team/keras-io guides/distributed_training_with_tensorflow.py

Changes Keras 3 itself needs (the notebooks were written for Keras 2) are
marked ``# Keras 3:``, test-only ones (sizes, seeds) ``# test:``. Where
the tutorial's code as published trains something else on several replicas
(uneven batches) or fails (multi-worker and parameter-server ``fit``, the
keras.io guide on 3 replicas), the test shows that too.

One bound is wider than 1e-5, and measured in its test: Adam turns float32
round-off into steps of the learning rate's order, so the custom-training
tutorial on 3 replicas is held to twice what reordering each batch's rows
moves the one-device run itself.
"""

import json
import sys

import numpy as np
import tensorflow as tf

from tests.programs import tutorial_mnist_setup as mnist_setup
from tests.support.launcher_harness import LauncherRun

SEED, SHUFFLE_SEED = mnist_setup.SEED, mnist_setup.SHUFFLE_SEED
CLUSTER_TIMEOUT = 400
KERAS_TUTORIAL_REPLICAS = 3  # the Keras tutorial's replicas (its save-and-load sequel's too)


def gap(expected, actual) -> float:
    """Largest absolute difference between two lists of weights."""
    assert len(expected) == len(actual)
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(expected, actual))


def mnist_datasets(num_train, num_test, seed):
    """``tfds.load('mnist', as_supervised=True)``'s train and test splits:
    (uint8 image 28x28x1, int64 label) examples."""
    (x_train, y_train), (x_test, y_test) = mnist_setup.load_data(num_train, num_test, seed)
    return (tf.data.Dataset.from_tensor_slices((x_train[..., None], y_train.astype(np.int64))),
            tf.data.Dataset.from_tensor_slices((x_test[..., None], y_test.astype(np.int64))))


def launch(tmp_path, program, launcher_args, *args):
    """Runs ``tests/programs/<program>`` under ``tfdist-run`` (``launcher_args``);
    returns (its output directory, the run)."""
    output_dir = tmp_path / "out"
    command = [sys.executable, f"tests/programs/{program}", f"--output_dir={output_dir}", *args]
    with LauncherRun(launcher_args, command) as run:
        assert run.wait(timeout=CLUSTER_TIMEOUT) == 0, run.output[-4000:]
    return output_dir, run


def worker_results(output_dir, workers=2):
    """Each worker's JSON results."""
    return [json.loads((output_dir / f"worker-{i}.json").read_text()) for i in range(workers)]
