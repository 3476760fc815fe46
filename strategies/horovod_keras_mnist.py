"""Horovod's Keras MNIST example, ported to tfdist (docs/guides/coming-from-horovod.md
maps its lines to tfdist's, one by one).

The original: horovod/horovod, examples/tensorflow2/tensorflow2_keras_mnist.py
(Apache License 2.0, Uber Technologies). Run it as Horovod users ran theirs:

    tfdist-run --num_workers=4 -- python strategies/horovod_keras_mnist.py   # horovodrun -np 4

or on one machine's GPUs, with no launcher (``--strategy=mirrored``).
``--synthetic`` trains on generated data of MNIST's shapes (no download);
the test runs it so (tests/scenarios/test_horovod_port.py) and compares it
with one device.
"""

import argparse
import json
import pathlib

import numpy as np

import tfdist

tfdist.import_tensorflow()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Horovod's LearningRateWarmupCallback as a schedule: from
    ``target_lr / factor`` up to ``target_lr`` over ``warmup_steps`` updates,
    then ``target_lr`` (Horovod's formula, per optimizer update)."""

    def __init__(self, target_lr, factor, warmup_steps):
        self.target_lr, self.factor, self.warmup_steps = target_lr, factor, warmup_steps

    def __call__(self, step):
        progress = keras.ops.minimum((keras.ops.cast(step, "float32") + 1.0) / self.warmup_steps,
                                     1.0)
        return self.target_lr / self.factor * (1.0 + (self.factor - 1.0) * progress)

    def get_config(self):
        return {"target_lr": self.target_lr, "factor": self.factor,
                "warmup_steps": self.warmup_steps}


def mnist_dataset(images, labels, global_batch_size, seed=0):
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(labels, tf.int64)))
    return dataset.repeat().shuffle(10000, seed=seed).batch(global_batch_size)


def build_model(dropout=True):
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, [3, 3], activation="relu"),
        keras.layers.Conv2D(64, [3, 3], activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.25 if dropout else 0.0),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5 if dropout else 0.0),
        keras.layers.Dense(10, activation="softmax"),
    ])


def compile_model(model, replicas, steps_per_epoch, warmup_epochs):
    # Horovod scaled the learning rate by hvd.size(), its batch being per
    # process; tfdist's batch is global, and so is this factor.
    schedule = LinearWarmup(0.001 * replicas, replicas, warmup_epochs * steps_per_epoch)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(),
                  optimizer=keras.optimizers.Adam(schedule), metrics=["accuracy"])


def main(args):
    strategy = tfdist.make_strategy(args.strategy)        # was: hvd.init() and GPU pinning
    process = tfdist.cluster.training_process()          # hvd.rank(), hvd.local_rank(), ...
    replicas = strategy.num_replicas_in_sync             # what hvd.size() scaled
    keras.utils.set_random_seed(args.seed)   # the same initial weights and data order everywhere
    if args.synthetic:
        images, labels = synthetic_mnist()
    else:
        (images, labels), _ = keras.datasets.mnist.load_data(path=f"mnist-{process.rank}.npz")
    dataset = mnist_dataset(images, labels, args.batch_per_replica * replicas)
    steps_per_epoch = args.steps // replicas
    with strategy.scope():
        model = build_model(dropout=args.dropout)
        compile_model(model, replicas, steps_per_epoch, args.warmup_epochs)
    # No DistributedOptimizer, broadcast or metric-average callbacks: the
    # strategy starts every replica from the chief's weights and reduces
    # gradients and metrics. The chief alone writes checkpoints, and a
    # restarted job resumes from them.
    tfdist.attach(model, strategy, checkpointing=tfdist.CheckpointOptions(args.checkpoint_dir))
    history = model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs, verbose=1)
    if args.results_dir:
        write_results(args.results_dir, process, model, history)


def synthetic_mnist(count=256, seed=0):
    """Generated data of MNIST's shapes and dtypes (uint8 28x28, labels 0-9)."""
    rng = np.random.RandomState(seed)
    return (rng.randint(0, 256, size=(count, 28, 28)).astype(np.uint8),
            rng.randint(0, 10, size=count).astype(np.uint8))


def write_results(results_dir, process, model, history):
    directory = pathlib.Path(results_dir)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{tfdist.cluster.task_name()}.json").write_text(json.dumps({
        "process": process.__dict__,
        "history": history.history,
        "weights": [w.tolist() for w in model.get_weights()],
    }))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="multi_worker_mirrored",
                        help="multi_worker_mirrored (under tfdist-run or TF_CONFIG) or mirrored")
    parser.add_argument("--batch_per_replica", type=int, default=128)
    parser.add_argument("--steps", type=int, default=500,
                        help="optimizer steps per epoch on one replica (Horovod's 500)")
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--warmup_epochs", type=int, default=3)
    parser.add_argument("--no_dropout", dest="dropout", action="store_false",
                        help="Dropout draws its own masks per replica; without it, N replicas "
                             "equal one device exactly")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--checkpoint_dir", default="./checkpoints")
    parser.add_argument("--results_dir", default=None, help="each process's history and weights")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
