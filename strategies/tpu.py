"""Train the image classifier on a Cloud TPU, or check it for one on CPU.

On a Cloud TPU VM (the chips are on this machine):

    python strategies/tpu.py --tpu=local --epochs=3

On a TPU node (a separate TPU reached through the Cloud TPU API):

    python strategies/tpu.py --tpu=my-tpu --zone=us-central1-b --project=my-project

Without a TPU, anywhere:

    python strategies/tpu.py --preflight              # will the step run on a TPU?
    python strategies/tpu.py --cpu_replicas=4         # the TPU path on 4 CPU replicas

``--preflight`` builds the same model and data, then `tfdist.tpu.preflight`
traces and XLA-compiles the training step at one TPU core's static shapes
and lists every problem (exit code 1 if any). ``--cpu_replicas`` trains with
the static-shape path a TPUStrategy uses (padded full batches, XLA steps,
host loops of ``--steps_per_execution``) on logical CPU devices.
"""

import os
import sys

from absl import app, flags, logging

import tfdist
from image_classifier import build_classifier, train_image_classifier
import recipes  # strategies/recipes.py: data and models of the examples

FLAGS = flags.FLAGS
flags.DEFINE_string("tpu", None, "'local' on a Cloud TPU VM, a TPU node's name, "
                    "grpc://HOST:PORT, or unset to read TPU_NAME.")
flags.DEFINE_string("zone", None, "The TPU node's zone.")
flags.DEFINE_string("project", None, "The TPU node's Google Cloud project.")
flags.DEFINE_float("tpu_timeout_seconds", 60.0, "How long to wait for the TPU.")
flags.DEFINE_bool("preflight", False, "Only check the model and data for a TPU (on CPU).")
flags.DEFINE_integer("num_cores", 8, "TPU cores the preflight plans for (8: v2-8 / v3-8).")
flags.DEFINE_integer("cpu_replicas", 0, "Train on this many logical CPU replicas with "
                     "the TPU's static-shape path instead of a TPU (0: use the TPU).")
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("batch_size", 128, "GLOBAL batch size (a multiple of 8 x cores).")
flags.DEFINE_string("dataset", "synthetic_patterns", "TFDS dataset name.")
flags.DEFINE_string("data_dir", os.path.expanduser("~/tensorflow_datasets"), "TFDS data directory.")
flags.DEFINE_string("model_dir", "/tmp/tfdist/tpu", "Checkpoints and summaries.")
flags.DEFINE_enum("model", "convnet", ["mlp", "convnet"], "Model architecture.")
flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate.")
flags.DEFINE_integer("steps_per_execution", 16, "Steps per host call (TPUs want many).")
flags.DEFINE_integer("log_every_steps", 16, "Steps between progress lines.")
flags.DEFINE_integer("seed", 0, "Shuffle and initialisation seed.")


def run_preflight() -> int:
    """Builds the program's model and data on CPU and prints the preflight."""
    train, _, info = recipes.image_classification_data(
        FLAGS.dataset, global_batch_size=FLAGS.batch_size, data_dir=FLAGS.data_dir,
        seed=FLAGS.seed)
    model = build_classifier(FLAGS.model, info, FLAGS.learning_rate, FLAGS.seed)
    # The last batch may be partial: tfdist pads it to the global batch size.
    report = tfdist.tpu.preflight(model, train,
                                  num_replicas=FLAGS.num_cores,
                                  global_batch_size=FLAGS.batch_size)
    print(report, flush=True)
    return 0 if report.ok else 1


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # tfdist prints its own progress.
    if FLAGS.preflight:
        sys.exit(run_preflight())
    if FLAGS.cpu_replicas:
        # First: logical devices must be configured before TensorFlow starts.
        strategy = tfdist.make_strategy("mirrored", num_replicas=FLAGS.cpu_replicas)
    else:
        strategy = tfdist.make_strategy("tpu", tpu=FLAGS.tpu, zone=FLAGS.zone,
                                        project=FLAGS.project,
                                        timeout_seconds=FLAGS.tpu_timeout_seconds)
    train_image_classifier(
        strategy, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
        batch_size=FLAGS.batch_size, model=FLAGS.model,
        learning_rate=FLAGS.learning_rate, epochs=FLAGS.epochs,
        model_dir=FLAGS.model_dir, steps_per_execution=FLAGS.steps_per_execution,
        static_shapes=True, log_every_steps=FLAGS.log_every_steps, seed=FLAGS.seed,
    )


if __name__ == "__main__":
    app.run(main)
