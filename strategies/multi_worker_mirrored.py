"""Train a small classifier with tfdist on several workers (MultiWorkerMirroredStrategy).

On one machine, with a local cluster made by the launcher:

    tfdist-run --num_workers=2 -- python strategies/multi_worker_mirrored.py --epochs=3

On real hosts, run the same program on each with its TF_CONFIG:

    TF_CONFIG='{"cluster": {"worker": ["host1:2222", "host2:2222"]},
                "task": {"type": "worker", "index": 0}}' \\
        python strategies/multi_worker_mirrored.py --model_dir=/shared/run1

TF_CONFIG is checked first: a mistake is an error naming the field. Every
worker trains on its part of each global batch; the result equals one device
on the same batches. Only worker 0 (the chief) prints progress and writes
checkpoints and summaries to ``--model_dir`` (a directory all workers can
read, to resume from). SIGTERM or Ctrl-C saves a checkpoint and exits with code 143;
``tfdist-run --max_restarts=1`` then resumes exactly where it stopped.
"""

import os

from absl import app, flags, logging

import tfdist
from image_classifier import train_image_classifier

FLAGS = flags.FLAGS
flags.DEFINE_integer("replicas_per_worker", 1, "Logical CPUs per worker (if no GPU).")
flags.DEFINE_enum("communication", "auto", ["auto", "ring", "nccl"], "Collectives.")
flags.DEFINE_float("peer_timeout_seconds", 10, "Heartbeat timeout: a silent peer becomes an error.")
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("batch_size", 128, "GLOBAL batch size (all workers).")
flags.DEFINE_string("dataset", "synthetic_patterns", "TFDS dataset name.")
flags.DEFINE_string("data_dir", os.path.expanduser("~/tensorflow_datasets"), "TFDS data directory.")
flags.DEFINE_string("model_dir", "/tmp/tfdist/multi_worker_mirrored", "Checkpoints and summaries.")
flags.DEFINE_enum("model", "mlp", ["mlp", "convnet"], "Model architecture.")
flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate.")
flags.DEFINE_integer("steps_per_execution", 1, "Steps per host call.")
flags.DEFINE_integer("log_every_steps", 20, "Steps between progress lines.")
flags.DEFINE_integer("seed", 0, "Shuffle and initialisation seed.")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # tfdist prints its own progress.
    strategy = tfdist.make_strategy(
        "multi_worker_mirrored", num_replicas=FLAGS.replicas_per_worker,
        communication=FLAGS.communication, peer_timeout_seconds=FLAGS.peer_timeout_seconds,
    )
    train_image_classifier(
        strategy, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
        batch_size=FLAGS.batch_size, model=FLAGS.model,
        learning_rate=FLAGS.learning_rate, epochs=FLAGS.epochs,
        model_dir=FLAGS.model_dir, steps_per_execution=FLAGS.steps_per_execution,
        log_every_steps=FLAGS.log_every_steps, seed=FLAGS.seed,
    )


if __name__ == "__main__":
    app.run(main)
