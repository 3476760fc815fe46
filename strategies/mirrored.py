"""Train a small classifier with tfdist on one host's replicas (MirroredStrategy).

    python strategies/mirrored.py --num_replicas=4 --epochs=3
    python strategies/mirrored.py --num_replicas=4 --keras_fit   # model.fit + tfdist.attach

Without GPUs, ``--num_replicas`` logical CPU devices are made; with GPUs,
all local GPUs are used unless ``--num_replicas`` says fewer. The default
dataset, ``synthetic_patterns``, is generated locally on first use;
``--dataset=mnist`` works where TFDS has mnist prepared in ``--data_dir``.
Checkpoints and TensorBoard summaries go to ``--model_dir``; run it again
with the same ``--model_dir`` and more ``--epochs`` to continue training.
"""

import os

from absl import app, flags, logging

import tfdist
from image_classifier import keras_fit_image_classifier, train_image_classifier

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_replicas", 2, "Replicas (logical CPUs if no GPU).")
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("batch_size", 128, "GLOBAL batch size (all replicas).")
flags.DEFINE_string("dataset", "synthetic_patterns", "TFDS dataset name.")
flags.DEFINE_string("data_dir", os.path.expanduser("~/tensorflow_datasets"), "TFDS data directory.")
flags.DEFINE_string("model_dir", "/tmp/tfdist/mirrored", "Checkpoints and summaries.")
flags.DEFINE_enum("model", "mlp", ["mlp", "convnet"], "Model architecture.")
flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate.")
flags.DEFINE_integer("steps_per_execution", 1, "Steps per host call.")
flags.DEFINE_enum("partial_batch", "exact", ["exact", "drop", "pad"], "Partial-batch policy.")
flags.DEFINE_bool("jit_compile", False, "XLA-compile the step (use --partial_batch=pad).")
flags.DEFINE_integer("log_every_steps", 20, "Steps between progress lines.")
flags.DEFINE_integer("seed", 0, "Shuffle and initialisation seed.")
flags.DEFINE_bool("keras_fit", False, "Train with Keras model.fit on arrays after "
                  "tfdist.attach (no checkpoints) instead of tfdist.Trainer.")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # tfdist prints its own progress.
    # First: logical devices must be configured before TensorFlow starts.
    strategy = tfdist.make_strategy("mirrored", num_replicas=FLAGS.num_replicas)
    if FLAGS.keras_fit:
        keras_fit_image_classifier(
            strategy, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
            batch_size=FLAGS.batch_size, model=FLAGS.model,
            learning_rate=FLAGS.learning_rate, epochs=FLAGS.epochs, seed=FLAGS.seed)
        return
    train_image_classifier(
        strategy, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
        batch_size=FLAGS.batch_size, model=FLAGS.model,
        learning_rate=FLAGS.learning_rate, epochs=FLAGS.epochs,
        model_dir=FLAGS.model_dir, steps_per_execution=FLAGS.steps_per_execution,
        partial_batch=FLAGS.partial_batch, jit_compile=FLAGS.jit_compile,
        log_every_steps=FLAGS.log_every_steps, seed=FLAGS.seed,
    )


if __name__ == "__main__":
    app.run(main)
