"""TensorFlow's "Multi-worker training with a custom training loop" tutorial,
adopted with tfdist (tensorflow/docs,
site/en/tutorials/distribute/multi_worker_with_ctl.ipynb: its ``main.py``).

Run by tests/scenarios/tutorials/test_multi_worker_ctl.py under ``tfdist-run --num_workers=2``. The
tutorial's code, with each change marked:

- ``# tfdist:`` ``tfdist.make_strategy``; ``tfdist.data.distribute`` for
  ``strategy.distribute_datasets_from_function`` (the same dataset_fn), so
  the step gets a `tfdist.Batch`; ``tfdist.replica.losses.replica_loss``
  for ``tf.nn.compute_average_loss``: it divides by the global example count
  (all-reduced), where ``compute_average_loss`` divides each replica's sum
  by its own batch size times the replicas, which over-weights the shorter
  replica batch at the end of a pass; `tfdist.checkpoint.TrainingCheckpoint`
  for the epoch / step_in_epoch variables, ``CheckpointManager`` and the
  ``write_filepath`` / ``_is_chief`` / ``_get_temp_dir`` helpers (it saves
  the optimizer too, and only the chief writes); it reads ``model.optimizer``,
  so the model is compiled with the tutorial's optimizer.
- ``# Keras 3:`` ``reset_state()`` (Keras 3 metrics have no ``reset_states``);
  the optimizer built in the scope before the checkpoint is made.
- ``# test:`` smaller sizes (per-worker batch 16, 5 steps per epoch: one pass
  whose last global batch is 8 + 7 rows) and a seeded shuffle.

Then, with a fresh model, the tutorial's loop as published (its
``compute_average_loss``), for comparison. Writes ``<output_dir>/<task>.json``.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402

PER_WORKER_BATCH_SIZE = 16  # the tutorial: 64
NUM_EPOCHS = 3
NUM_STEPS_PER_EPOCH = 5  # the tutorial: 70


def adopted(strategy, mnist, global_batch_size, checkpoint_dir):
    """The tutorial's main.py with tfdist; returns what the test compares."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(mnist.SEED)  # test: the one-device reference's weights and orders
    with strategy.scope():
        # Model building/compiling need to be within `tf.distribute.Strategy.scope`.
        multi_worker_model = mnist.build_cnn_model()

        # tfdist: was strategy.distribute_datasets_from_function(...)
        multi_worker_dataset = tfdist.data.distribute(
            strategy, lambda input_context: mnist.dataset_fn(global_batch_size, input_context))
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
            name='train_accuracy')
        multi_worker_model.compile(optimizer=optimizer)  # tfdist: the checkpoint saves it
        optimizer.build(multi_worker_model.trainable_variables)  # Keras 3: built in the scope
        # tfdist: replaces epoch / step_in_epoch, CheckpointManager and write_filepath
        checkpoint = tfdist.checkpoint.TrainingCheckpoint.for_strategy(
            multi_worker_model, strategy, checkpoint_dir)

    @tf.function
    def train_step(iterator):
        """Training step function."""

        def step_fn(inputs):
            """Per-Replica step function."""
            batch = tfdist.Batch.from_structure(inputs)  # tfdist
            x, y = batch.x, batch.y  # tfdist: was x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True,
                    reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
                # tfdist: was tf.nn.compute_average_loss(per_example_loss)
                loss = tfdist.replica.losses.replica_loss(per_example_loss, batch)
                model_losses = multi_worker_model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))

            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(
                zip(grads, multi_worker_model.trainable_variables))
            train_accuracy.update_state(y, predictions)

            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    # Restoring the checkpoint
    checkpoint.restore_latest()  # tfdist: was tf.train.latest_checkpoint + restore
    position = checkpoint.position()

    history = {"loss": [], "accuracy": []}
    # Resume our CTL training
    while position.epoch < NUM_EPOCHS:
        iterator = iter(multi_worker_dataset)
        total_loss = 0.0
        num_batches = 0

        while position.step_in_epoch < NUM_STEPS_PER_EPOCH:
            total_loss += train_step(iterator)
            num_batches += 1
            position.advance(1)  # tfdist: was step_in_epoch.assign_add(1)

        train_loss = total_loss / num_batches
        print('Epoch: %d, accuracy: %f, train_loss: %f.'
              % (position.epoch, train_accuracy.result(), train_loss), flush=True)
        history["loss"].append(float(train_loss))
        history["accuracy"].append(float(train_accuracy.result()))

        train_accuracy.reset_state()  # Keras 3: was reset_states()

        position.next_epoch()  # tfdist: was epoch.assign_add(1); step_in_epoch.assign(0)
        checkpoint.save_position(position)  # tfdist: every worker calls, the chief writes
    return {"history": history,
            "weights": [w.tolist() for w in multi_worker_model.get_weights()]}


def as_published(strategy, mnist, global_batch_size):
    """The tutorial's loop unchanged (but for Keras 3 and the sizes), no
    checkpoints: its final weights."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(mnist.SEED)
    with strategy.scope():
        multi_worker_model = mnist.build_cnn_model()
        multi_worker_dataset = strategy.distribute_datasets_from_function(
            lambda input_context: mnist.dataset_fn(global_batch_size, input_context))
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        optimizer.build(multi_worker_model.trainable_variables)  # Keras 3: built in the scope

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True,
                    reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = multi_worker_model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    for _ in range(NUM_EPOCHS):
        iterator = iter(multi_worker_dataset)
        for _ in range(NUM_STEPS_PER_EPOCH):
            train_step(iterator)
    return [w.tolist() for w in multi_worker_model.get_weights()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--checkpoint_dir", required=True)
    args = parser.parse_args()

    per_worker_batch_size = PER_WORKER_BATCH_SIZE
    tf_config = json.loads(os.environ['TF_CONFIG'])
    num_workers = len(tf_config['cluster']['worker'])
    global_batch_size = per_worker_batch_size * num_workers

    # Define Strategy
    # tfdist: was strategy = tf.distribute.MultiWorkerMirroredStrategy()
    strategy = tfdist.make_strategy("multi_worker_mirrored")

    from tests.programs import tutorial_mnist as mnist  # the tutorial's mnist.py

    results = adopted(strategy, mnist, global_batch_size, args.checkpoint_dir)
    results["as_published_weights"] = as_published(strategy, mnist, global_batch_size)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"{tfdist.cluster.task_name()}.json"), "w",
              encoding="utf-8") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
