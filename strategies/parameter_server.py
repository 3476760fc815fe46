"""Train an embedding classifier with parameter servers (ParameterServerStrategy).

On one machine, with a local cluster made by the launcher (the program runs
as the chief; workers and ps tasks run `python -m tfdist.server`):

    tfdist-run --num_workers=2 --num_ps=2 -- python strategies/parameter_server.py

On real hosts, start `python -m tfdist.server` on every worker and ps host
and this program on the chief host, each with its TF_CONFIG (same cluster,
its own task), e.g. for the chief:

    TF_CONFIG='{"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"],
                            "ps": ["p0:2222", "p1:2222"]},
                "task": {"type": "chief", "index": 0}}' \\
        python strategies/parameter_server.py --model_dir=/shared/run1

Images become tokens (pixel position x intensity bucket), so the model has
a 4096 x 16 embedding table; variables over ``--min_shard_kib`` are split
over the ps tasks. Training is asynchronous: each worker takes whole global
batches of its own share of the data and updates the variables on its own
schedule (no exactness claim with more than one worker). Evaluation runs on
the chief over the whole test split. Checkpoints go to ``--model_dir``;
running again resumes, and ``tfdist-run --max_restarts=1`` restarts the
cluster from the latest one when a ps task dies.
"""

from absl import app, flags, logging
import keras

import tfdist

import recipes  # strategies/recipes.py: data and models of the examples

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch (workers read endlessly).")
flags.DEFINE_integer("batch_size", 64, "Batch size of one worker's step.")
flags.DEFINE_string("dataset", "synthetic_patterns", "TFDS dataset name.")
flags.DEFINE_string("data_dir", None, "TFDS data directory (default ~/tensorflow_datasets).")
flags.DEFINE_string("model_dir", "/tmp/tfdist/parameter_server", "Checkpoints and summaries.")
flags.DEFINE_float("learning_rate", 0.05, "Adam learning rate.")
flags.DEFINE_integer("min_shard_kib", 64, "Variables larger than this are sharded over ps tasks.")
flags.DEFINE_integer("steps_per_execution", 1, "Steps per scheduled closure.")
flags.DEFINE_integer("log_every_steps", 20, "Steps between progress lines.")
flags.DEFINE_float("timeout_seconds", 120, "How long to wait for the servers.")
flags.DEFINE_integer("seed", 0, "Shuffle and initialisation seed.")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # tfdist prints its own progress.
    strategy = tfdist.make_strategy(
        "parameter_server", min_shard_bytes=FLAGS.min_shard_kib << 10,
        timeout_seconds=FLAGS.timeout_seconds,
    )
    train, test, info = recipes.token_classification_data(
        FLAGS.dataset, global_batch_size=FLAGS.batch_size, data_dir=FLAGS.data_dir,
        seed=FLAGS.seed,
    )
    keras.utils.set_random_seed(FLAGS.seed)
    with strategy.scope():
        model = recipes.build_embedding_model(
            info["vocabulary"], info["sequence_length"], info["num_classes"]
        )
        model.compile(optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      steps_per_execution=FLAGS.steps_per_execution)
    table = model.get_layer("embedding").embeddings
    shards = tfdist.strategies.sharded.shards(table)
    print(f"embedding {tuple(table.shape)} in {len(shards)} shard(s): "
          + ", ".join(v.device for v in shards), flush=True)
    trainer = tfdist.Trainer(model, strategy,
        checkpointing=tfdist.CheckpointOptions(FLAGS.model_dir),
        reporting=tfdist.ReportingOptions(log_every_steps=FLAGS.log_every_steps))
    trainer.fit(train, epochs=FLAGS.epochs, steps_per_epoch=FLAGS.steps_per_epoch,
                validation_data=test)
    results = trainer.evaluate(test)
    print("final | " + " | ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)


if __name__ == "__main__":
    app.run(main)
