"""A custom training loop on tfdist's layer, without the Trainer.

    python strategies/custom_loop.py --num_replicas=4 --epochs=3
    python strategies/custom_loop.py --static_shapes        # the TPU path, on CPUs
    tfdist-run --num_workers=2 --max_restarts=1 -- python strategies/custom_loop.py \
        --strategy=multi_worker_mirrored --checkpoint_dir=/tmp/custom_loop

`train` below is the loop docs/guides/custom-loops.md shows: per-replica math written by the
user; tfdist supplies the distributed batches (`tfdist.Batch`: partial and
empty-replica batches made safe with a mask), the replica's share of the
global loss (`tfdist.replica.losses.replica_loss`: the true global example count,
no extra collective), cross-replica metrics read once per epoch
(`tfdist.replica.metrics`), exact clipping and gradient accumulation
(`tfdist.replica.gradients`, `tfdist.replica.accumulation`), a checkpoint that resumes
mid-epoch (`tfdist.checkpoint`), and k steps per host call (`tfdist.loops.host_loop`).
It gives the weights, loss and accuracy of single-device Keras ``fit`` on the
same batches (tests/loops/test_custom_loop.py).
"""

import json
import os

from absl import app, flags, logging

import tfdist

import recipes  # strategies/recipes.py: data and models of the examples

FLAGS = flags.FLAGS
flags.DEFINE_enum("strategy", "mirrored",
                  ["one_device", "mirrored", "multi_worker_mirrored", "tpu"],
                  "Strategy (multi_worker_mirrored: run under tfdist-run; tpu: a Cloud TPU).")
flags.DEFINE_integer("num_replicas", 2, "Replicas per worker (logical CPUs if no GPU).")
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("batch_size", 128, "GLOBAL batch size (all replicas).")
flags.DEFINE_integer("train_examples", None, "Train on the first N examples only.")
flags.DEFINE_integer("steps_per_execution", 1, "Steps per host call (tf.range loop).")
flags.DEFINE_bool("static_shapes", False, "Padded static batches and an XLA-compiled "
                  "step: the TPU path, on any device (always on for --strategy=tpu).")
flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"], "Adam(1e-3) or SGD(0.05).")
flags.DEFINE_float("global_clipnorm", None, "Clip gradients by their global norm.")
flags.DEFINE_integer("accumulation_steps", None, "Gradient accumulation over k batches.")
flags.DEFINE_string("checkpoint_dir", None, "Resume from / save to this directory "
                    "(every epoch, and on SIGTERM or Ctrl-C).")
flags.DEFINE_string("result_json", None, "Write the final weights and history here "
                    "(per task: {task} is replaced by e.g. worker-0).")
flags.DEFINE_string("data_dir", os.path.expanduser("~/tensorflow_datasets"), "TFDS data directory.")


# [custom-loop]
def train(strategy, model, dataset, epochs, checkpoint_dir=None, steps_per_execution=1,
          static_shapes=False):
    """Trains a compiled ``model`` on ``dataset`` (global batches); returns the
    ``{"loss": [...], "accuracy": [...]}`` of each epoch it ran. With a
    ``checkpoint_dir`` it resumes where a stopped run left off, and on SIGTERM
    or Ctrl-C saves and raises `tfdist.Preempted` (exit code 143 / 130)."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    with strategy.scope():  # replica-local sums, reduced when read
        loss_mean = keras.metrics.Mean(name="loss")
        accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        model.optimizer.build(model.trainable_variables)
        # Exact `gradient_accumulation_steps` if the optimizer asks (else None).
        accumulator = tfdist.replica.accumulation.accumulator_for(model, strategy)
        checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
            model, strategy, checkpoint_dir, metrics=[loss_mean, accuracy],
            accumulator=accumulator)  # model, optimizer, metrics, data position

    def forward_backward(structure):  # XLA-compiled on the static-shape (TPU) path
        batch = tfdist.Batch.from_structure(structure)
        with tf.GradientTape() as tape:
            predictions = model(batch.x, training=True)
            per_example = loss_fn(batch.y, predictions)
            loss = tfdist.replica.losses.replica_loss(per_example, batch, model)
        return predictions, per_example, tape.gradient(loss, model.trainable_variables)

    if static_shapes:
        forward_backward = tf.function(forward_backward, jit_compile=True)

    def replica_step(batch):  # a tfdist.Batch: x, y, sample_weight, mask, global_examples
        predictions, per_example, gradients = forward_backward(batch.to_structure())
        # Metrics first: the loss Keras reports uses the weights before the update.
        tfdist.replica.metrics.update_loss_mean(loss_mean, per_example, batch, model)
        tfdist.replica.metrics.update_metrics([accuracy], batch, predictions)
        if accumulator is not None:
            accumulator.add(gradients, batch.carried_global_examples())
        else:  # summed over replicas, then clipped (if the optimizer clips), as on one device
            tfdist.replica.gradients.apply_gradients(model.optimizer, gradients, model.trainable_variables)

    loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=steps_per_execution,
                                after_step=None if accumulator is None else accumulator.after_step)
    checkpoint.restore_latest()
    position = checkpoint.position()  # epoch and step of the epoch to resume at
    history = {"loss": [], "accuracy": []}
    with tfdist.loops.preemption.PreemptionWatcher() as stop_signal:
        while position.epoch < epochs:
            # "pad": every batch full-size with a mask (static shapes); else padding
            # only where a global batch would leave a replica empty.
            batches = tfdist.data.distribute(
                strategy, dataset, epoch=position.epoch, skip_steps=position.step_in_epoch,
                partial_batch="pad" if static_shapes else "exact", avoid_empty_replicas=True)
            for execution in loop.executions(batches, stop_signal):  # frees its iterator off-thread
                position.advance(execution.steps)
                if execution.stop:  # every worker stops after the same step
                    checkpoint.save_position(position)
                    raise tfdist.Preempted(position.step, stop_signal.signum,
                                           saved=checkpoint_dir is not None)
            if accumulator is not None:
                accumulator.flush()  # an epoch's partial accumulation is applied
            for metric in (loss_mean, accuracy):  # one reduction each, per epoch
                history[metric.name].append(float(metric.result()))
                metric.reset_state()
            print(f"custom loop | epoch {position.epoch + 1} | loss {history['loss'][-1]:.4f}"
                  f" | accuracy {history['accuracy'][-1]:.4f}", flush=True)
            position.next_epoch()
            checkpoint.save_position(position)
    return history
# [/custom-loop]


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    options = {"num_replicas": FLAGS.num_replicas} if FLAGS.strategy in ("mirrored",
                                                                         "multi_worker_mirrored") else {}
    strategy = tfdist.make_strategy(FLAGS.strategy, **options)
    import keras  # pylint: disable=import-outside-toplevel

    train_data, _, info = recipes.image_classification_data(
        "synthetic_patterns", global_batch_size=FLAGS.batch_size, data_dir=FLAGS.data_dir,
        train_examples=FLAGS.train_examples)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = recipes.build_model("mlp", info["input_shape"], info["num_classes"])
        optimizer, learning_rate = {"adam": (keras.optimizers.Adam, 1e-3),
                                    "sgd": (keras.optimizers.SGD, 0.05)}[FLAGS.optimizer]
        model.compile(optimizer=optimizer(
            learning_rate, global_clipnorm=FLAGS.global_clipnorm,
            gradient_accumulation_steps=FLAGS.accumulation_steps))
    static = FLAGS.static_shapes or tfdist.replica.static_shapes.is_tpu(strategy)
    try:
        history = train(strategy, model, train_data, FLAGS.epochs, FLAGS.checkpoint_dir,
                        FLAGS.steps_per_execution, static)
    except tfdist.Preempted as stopped:  # exits 143 (SIGTERM) / 130 (Ctrl-C)
        print(stopped, flush=True)  # "preempted (SIGTERM): checkpoint saved at step N"
        raise
    if FLAGS.result_json:
        task = tfdist.cluster.task_name()
        with open(FLAGS.result_json.format(task=task), "w", encoding="utf-8") as out:
            json.dump({"history": history,
                       "weights": [w.tolist() for w in model.get_weights()]}, out)


if __name__ == "__main__":
    app.run(main)
