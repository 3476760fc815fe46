"""Chief program for parameter-server tests (run under tfdist-run --num_ps).

--model=mlp: tests/support/reference.py's MLP on its data (exactness with 1 worker).
--model=embedding: strategies/recipes.py's embedding model on synthetic_patterns
(built in --data_dir), its table sharded when there are 2+ ps tasks.
--model=count_ids: 70 examples whose first feature is their id, and a layer
that counts (on the ps) how often each id is trained on; the counts of
every epoch go to chief.json as "id_counts" (for the tf.data service).

Writes ``<output_dir>/chief.json``: history, evaluation, the Trainer's and
the optimizer's step counts, weights (mlp), predictions on the first test
batch and where the embedding table's shards live (embedding). With
--checkpoint_dir, fit resumes from (or, at the target epoch, only restores)
the checkpoint there.
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
# strategies/recipes.py: the example programs' data and models.
sys.path.append(str(pathlib.Path(__file__).resolve().parents[2] / "strategies"))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--model", default="mlp", choices=["mlp", "embedding", "penalty_loss", "returns_batch_values", "count_ids"],
                        help="penalty_loss: tests/support/models.py's compute_loss "
                             "override (a model's own step) on (x, y) batches; "
                             "returns_batch_values: its train_step returning values beside "
                             "the metrics")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=5)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--step_delay", type=float, default=0.0)
    parser.add_argument("--input", default="dataset", choices=["dataset", "dataset_fn"],
                        help="mlp: pass a dataset, or a dataset_fn(input_context) sharding it")
    parser.add_argument("--log_every_steps", type=int, default=5)
    parser.add_argument("--data_service", default=None, help="DataOptions(data_service=...)")
    parser.add_argument("--validation_examples", type=int, default=0,
                        help="also validate on this many examples each epoch (0: no)")
    args = parser.parse_args()

    strategy = tfdist.make_strategy("parameter_server", timeout_seconds=60, min_shard_bytes=16 << 10)
    import keras  # pylint: disable=import-outside-toplevel

    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    counts_per_epoch, extra_callbacks = [], []
    if args.model == "count_ids":
        train, test, model, counts = _id_counting(strategy, keras, ref)

        class ReadCounts(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                counts_per_epoch.append(counts.numpy().round().astype(int).tolist())
                counts.assign(np.zeros(70, "float32"))

        extra_callbacks.append(ReadCounts())
    elif args.model in ("penalty_loss", "returns_batch_values"):
        from tests.support import models  # pylint: disable=import-outside-toplevel

        train = test = ref.global_batches(70, 16, weighted=False)
        with strategy.scope():
            model = models.compiled_model({"penalty_loss": models.PenaltyLoss,
                                           "returns_batch_values": models.ReturnsBatchValues,
                                           }[args.model])
    elif args.model == "mlp":
        train = test = ref.global_batches(70, 16)
        if args.input == "dataset_fn":
            def train(input_context):  # pylint: disable=function-redefined
                return ref.global_batches(70, 16).shard(
                    input_context.num_input_pipelines, input_context.input_pipeline_id)
        with strategy.scope():
            model = ref.compile_model(ref.build_mlp(), "adam")
    else:
        import recipes  # pylint: disable=import-outside-toplevel

        train, test, info = recipes.token_classification_data(
            "synthetic_patterns", global_batch_size=64, data_dir=args.data_dir)
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = recipes.build_embedding_model(
                info["vocabulary"], info["sequence_length"], info["num_classes"])
            model.compile(optimizer=keras.optimizers.Adam(0.05),
                          loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(args.step_delay)

    trainer = tfdist.Trainer(model, strategy,
        checkpointing=tfdist.CheckpointOptions(args.checkpoint_dir,
                                               every_steps=args.checkpoint_every_steps),
        input_pipeline=tfdist.DataOptions(data_service=args.data_service),
        reporting=tfdist.ReportingOptions(log_every_steps=args.log_every_steps))
    try:  # Local SGD has no replicas to average here: a clear error.
        tfdist.Trainer(model, strategy, communication=tfdist.communication.LocalSGD(2))
        local_sgd_error = None
    except tfdist.errors.ConfigurationError as error:
        local_sgd_error = str(error)
    try:  # Without steps_per_epoch: a clear error, and nothing trained.
        trainer.fit(train, epochs=1)
        missing_steps_error = None
    except tfdist.errors.ConfigurationError as error:
        missing_steps_error = str(error)
    validation = (ref.global_batches(args.validation_examples, 16)
                  if args.validation_examples else None)
    callbacks = ([Slow()] if args.step_delay else []) + extra_callbacks
    history = trainer.fit(train, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                          verbose=1, callbacks=callbacks, validation_data=validation)
    if args.model == "count_ids":  # a second fit: its epoch 0 is a pass of its own
        trainer.fit(train, epochs=1, steps_per_epoch=args.steps_per_epoch, verbose=0,
                    callbacks=extra_callbacks)
    first_batch = next(iter(test))[0]
    result = {
        "missing_steps_error": missing_steps_error,
        "local_sgd_error": local_sgd_error,
        "history": history.history,
        "evaluate": trainer.evaluate(test),
        "trainer_steps": trainer.step,
        "optimizer_iterations": int(model.optimizer.iterations.numpy()),
        "predictions": model(first_batch, training=False).numpy().tolist(),
        "trainer_predict": np.asarray(trainer.predict(test)).tolist(),
    }
    if counts_per_epoch:
        result["id_counts"] = counts_per_epoch
    if args.model != "embedding":
        result["weights"] = [w.tolist() for w in model.get_weights()]
    else:
        table = model.get_layer("embedding").embeddings
        pieces = tfdist.strategies.sharded.shards(table)
        result["embedding_shards"] = [[v.device, list(v.shape)] for v in pieces]
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "chief.json"), "w", encoding="utf-8") as out:
        json.dump(result, out)


def _id_counting(strategy, keras, ref):
    """``(train, test, model, counts)`` for --model=count_ids."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ids = np.arange(70, dtype="float32")
    x = np.stack([ids, np.sin(ids), np.cos(ids), ids % 5], axis=1).astype("float32")
    y = (np.arange(70) % 3).astype("int64")
    train = test = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    class CountIds(keras.layers.Layer):
        """Adds 1 to ``counts[id]`` for each example trained on."""

        def build(self, input_shape):
            self.counts = self.add_weight(shape=(70,), initializer="zeros", trainable=False,
                                          name="counts")

        def call(self, inputs, training=False):
            if training:
                ids_seen = tf.cast(tf.round(inputs[:, 0]), tf.int32)
                self.counts.assign_add(tf.math.bincount(
                    ids_seen, minlength=70, maxlength=70, dtype=tf.float32))
            return inputs

    with strategy.scope():
        counter = CountIds()
        model = keras.Sequential([keras.Input((4,)), counter, keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    del ref
    return train, test, model, counter.counts


if __name__ == "__main__":
    main()
