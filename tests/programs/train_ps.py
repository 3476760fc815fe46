"""Chief program for parameter-server tests (run under tfdist-run --num_ps).

--model=mlp: tests/reference.py's MLP on its data (exactness with 1 worker).
--model=embedding: tfdist.recipes' embedding model on synthetic_patterns.
Writes ``<output_dir>/chief.json``: history, evaluation, weights and where
the embedding table's shards live; saves a checkpoint to --checkpoint_dir.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=5)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--step_delay", type=float, default=0.0)
    args = parser.parse_args()

    strategy = tfdist.make_strategy("parameter_server", timeout_seconds=60, min_shard_bytes=16 << 10)
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tests import reference as ref  # pylint: disable=import-outside-toplevel

    if args.model == "mlp":
        data = ref.global_batches(70, 16)
        with strategy.scope():
            model = ref.compile_model(ref.build_mlp(), "adam")
    else:
        train = tfdist.data.load_tfds("synthetic_patterns", "train", data_dir=args.data_dir)
        data = train.map(lambda x, y: tfdist.recipes.pixel_tokens(tf.cast(x, tf.float32) / 255.0, y)).batch(64)
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = tfdist.recipes.build_embedding_model(256 * 16, 256, 10)
            model.compile(optimizer=keras.optimizers.Adam(0.01),
                          loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            import time  # pylint: disable=import-outside-toplevel
            time.sleep(args.step_delay)

    trainer = tfdist.Trainer(model, strategy, checkpoint_dir=args.checkpoint_dir, log_every_steps=5)
    history = trainer.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                          verbose=1, callbacks=[Slow()] if args.step_delay else None)
    result = {"history": history.history, "evaluate": trainer.evaluate(data.take(10))}
    result["weights"] = [w.tolist() for w in model.get_weights()] if args.model == "mlp" else None
    if args.model != "mlp":
        table = model.get_layer("embedding").embeddings.value
        shards = getattr(table, "variables", [table])
        result["embedding_shards"] = [(v.device, list(v.shape)) for v in shards]
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "chief.json"), "w", encoding="utf-8") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
