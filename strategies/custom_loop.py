"""A custom training loop on tfdist's layer, without the Trainer.

    python strategies/custom_loop.py --num_replicas=4 --epochs=3
    tfdist-run --num_workers=2 -- python strategies/custom_loop.py --strategy=multi_worker_mirrored

`train` below is the loop the README shows: per-replica math written by the
user; tfdist supplies the distributed batches (`tfdist.Batch`: partial and
empty-replica batches made safe with a mask), the replica's share of the
global loss (`tfdist.losses.replica_loss`: the true global example count,
no extra collective) and cross-replica metrics read once per epoch
(`tfdist.metrics`). On 1, 2 or 4 replicas it gives the weights, loss and
accuracy of single-device Keras ``fit`` on the same batches
(tests/test_custom_loop.py).
"""

import os

from absl import app, flags, logging

import tfdist

FLAGS = flags.FLAGS
flags.DEFINE_enum("strategy", "mirrored", ["one_device", "mirrored", "multi_worker_mirrored"],
                  "Strategy (multi_worker_mirrored: run under tfdist-run).")
flags.DEFINE_integer("num_replicas", 2, "Replicas per worker (logical CPUs if no GPU).")
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("batch_size", 128, "GLOBAL batch size (all replicas).")
flags.DEFINE_string("data_dir", os.path.expanduser("~/tensorflow_datasets"), "TFDS data directory.")


# [custom-loop]
def train(strategy, model, dataset, epochs):
    """Trains a compiled ``model`` on ``dataset`` (global batches); returns
    the per-epoch ``{"loss": [...], "accuracy": [...]}``."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    with strategy.scope():  # replica-local sums, reduced when read
        loss_mean = keras.metrics.Mean(name="loss")
        accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        model.optimizer.build(model.trainable_variables)

    @tf.autograph.experimental.do_not_convert
    def replica_step(element):
        batch = tfdist.Batch.from_structure(element)  # x, y, sample_weight, mask, ...
        with tf.GradientTape() as tape:
            predictions = model(batch.x, training=True)
            per_example = loss_fn(batch.y, predictions)
            loss = tfdist.losses.replica_loss(per_example, batch, model)
        # Metrics first: the loss Keras reports uses the weights before the update.
        tfdist.metrics.update_loss_mean(loss_mean, per_example, batch, model)
        tfdist.metrics.update_metrics([accuracy], batch, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        # Summed over replicas, then clipped (if the optimizer clips), as on one device.
        tfdist.gradients.apply_gradients(model.optimizer, gradients, model.trainable_variables)

    @tf.function
    def train_step(element):
        strategy.run(replica_step, args=(element,))

    history = {"loss": [], "accuracy": []}
    for epoch in range(epochs):
        # Padding (with a mask) where a global batch would leave a replica
        # empty; an EpochDataset is rebuilt (reshuffled) for each epoch.
        batches = tfdist.data.distribute(strategy, dataset, epoch=epoch,
                                         avoid_empty_replicas=True)
        for element in batches:
            train_step(element)
        for metric in (loss_mean, accuracy):  # one reduction each, per epoch
            history[metric.name].append(float(metric.result()))
            metric.reset_state()
    return history
# [/custom-loop]


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    options = {} if FLAGS.strategy == "one_device" else {"num_replicas": FLAGS.num_replicas}
    strategy = tfdist.make_strategy(FLAGS.strategy, **options)
    import keras  # pylint: disable=import-outside-toplevel

    train_data, _, info = tfdist.recipes.image_classification_data(
        "synthetic_patterns", global_batch_size=FLAGS.batch_size, data_dir=FLAGS.data_dir)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = tfdist.recipes.build_model("mlp", info["input_shape"], info["num_classes"])
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = train(strategy, model, train_data, FLAGS.epochs)
    if getattr(strategy.extended, "should_checkpoint", True):
        for epoch, (loss, acc) in enumerate(zip(history["loss"], history["accuracy"])):
            print(f"custom loop | epoch {epoch + 1} | loss {loss:.4f} | accuracy {acc:.4f}",
                  flush=True)


if __name__ == "__main__":
    app.run(main)
