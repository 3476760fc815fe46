"""The training program of `scripts/soak.py` (a child program, in scripts/bench/
with the benchmarks' `cluster_program.py`): fast steps for a long time.

Trains a small MLP (6 inputs, 16 hidden, 3 classes) on generated data with
global batch 8 and ``steps_per_execution=1``: the fastest steps this machine
can run, so per-step costs (threads, memory, files) show up quickly. Runs
under ``tfdist-run`` as every worker (MultiWorkerMirroredStrategy), as the
chief of a parameter-server cluster (``--strategy=parameter_server``) or as
the chief of a pipeline whose second stage is a worker's server
(``--strategy=pipeline``, under ``tfdist-run --workers_serve``), or as
every worker of data x pipeline (``--strategy=pipeline_per_worker``: one
replica per worker, each worker's pipeline of 2 stages over its 2 logical
CPUs; with ``--fully_sharded`` each stage's weights sharded over the
workers), or as every worker of data x pipeline x model
(``--strategy=mesh_per_worker``: each worker's 4 logical CPUs 2 stages of 2
model devices, the hidden layer split by columns, the head by rows), with a
checkpoint every ``--checkpoint_every_steps`` steps, until ``--steps`` are
done or it is stopped (SIGTERM: it saves and exits 143). With
``--epoch_steps=N`` it trains epochs of N steps, each a pass over finite data
with an iterator of its own (made, run out, and freed: what
`tfdist.data.iterator_release` does at every epoch end); by default one epoch.
With ``--endless_data`` the data is ``repeat()``-ed without end, so the
executions run without an end-of-data check (`tfdist.loops.runners.synchronous`).
"""

import tfdist
from absl import app, flags

flags.DEFINE_enum("strategy", "multi_worker_mirrored",
                  ["multi_worker_mirrored", "parameter_server", "pipeline",
                   "pipeline_per_worker", "mesh_per_worker"],
                  "Every worker, or the chief (parameter servers; pipeline: a "
                  "tfdist.parallel.Pipeline of 2 stages, the chief's and a worker server's, "
                  "2 micro-batches per batch; pipeline_per_worker: every worker, one "
                  "replica each, its own pipeline of 2 stages over its 2 logical CPUs; "
                  "mesh_per_worker: data x pipeline x model, each worker's 4 logical CPUs "
                  "2 stages of 2 model devices).")
flags.DEFINE_integer("steps", 1_000_000, "Training steps (SIGTERM stops it sooner).")
flags.DEFINE_string("checkpoint_dir", None, "Where checkpoints go (required).")
flags.DEFINE_integer("checkpoint_every_steps", 500, "Steps between checkpoints.")
flags.DEFINE_integer("log_every_steps", 100, "Steps between progress lines.")
flags.DEFINE_integer("steps_per_execution", 1, "Steps per host call.")
flags.DEFINE_integer("epoch_steps", 0, "Steps per epoch, each epoch a fresh pass (0: one epoch).")
flags.DEFINE_bool("async_checkpoint", False,
                  "CheckpointOptions(async_write=True): saves written in the background.")
flags.DEFINE_string("data_service", None,
                    "DataOptions(data_service=...): 'auto' under --data_service_workers.")
flags.DEFINE_integer("local_sgd", 0,
                     "Trainer(communication=LocalSGD(every_steps=N)) (0: synchronous).")
flags.DEFINE_string("gossip", "",
                    "Trainer(communication=Gossip(TOPOLOGY)) (empty: synchronous).")
flags.DEFINE_bool("sharded_state", False, "Trainer(communication=ShardedOptimizerState()); its "
                  "checkpoints gather the state whole.")
flags.DEFINE_bool("fully_sharded", False, "Trainer(communication=FullySharded()); its "
                  "checkpoints read the weights and the state whole.")
flags.DEFINE_bool("endless_data", False, "One epoch over endless data (repeat()): the loop "
                  "without an end-of-data check, also under MWMS.")
flags.DEFINE_enum("model", "mlp", ["mlp", "embedding"],
                  "embedding: token ids padded per batch to 2..10, Embedding(mask_zero=True) "
                  "+ pooling (sparse gradients whose all-gathers change shape from step to step).")
FLAGS = flags.FLAGS


def _as_padded_token_batches(data, tf):
    """The same batches as rows of token ids (1..49), 2..10 of them per row
    (both read off the row's features), each batch cut to its longest row:
    the batch's length, and so its sparse gradient's shape, changes most steps."""

    def tokens(features, labels):
        seed = tf.cast(tf.abs(features[:, :2]) * 1000, tf.int32)
        ids = seed[:, :1] % 47 + 1 + tf.range(10)[None, :] % 3
        lengths = 2 + seed[:, 1:] % 9
        ids = tf.where(tf.range(10)[None, :] < lengths, ids, 0)
        return ids[:, :tf.reduce_max(lengths)], labels

    return data.map(tokens)


def _mesh_layout(strategy):
    """The workers' data x pipeline x model mesh: the hidden layer split by
    columns on stage 0, the head by rows on stage 1."""
    import keras  # pylint: disable=import-outside-toplevel

    devices = tfdist.parallel.mesh_devices(strategy, model_devices=4)
    mesh = keras.distribution.DeviceMesh((2, 2, 2), ["batch", "pipeline", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*first/kernel"] = (None, "model")
    layout_map[".*first/bias"] = ("model",)
    layout_map[".*head/kernel"] = ("model", None)
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def main(argv) -> None:
    del argv  # every option is a flag
    args = FLAGS
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    parallel = None
    if args.strategy == "pipeline":
        parallel = tfdist.parallel.Pipeline(
            cuts=["first"], micro_batches=2,
            devices=tfdist.parallel.task_devices(timeout_seconds=60))
        strategy = tf.distribute.get_strategy()  # (one replica: the pipeline's stages)
    elif args.strategy == "pipeline_per_worker":  # data x pipeline (x fully sharded)
        tfdist.strategies.configure_logical_cpus(2)  # (the replica's, then its second stage's)
        strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=1)
        parallel = tfdist.parallel.Pipeline(cuts=["first"], micro_batches=2)
    elif args.strategy == "mesh_per_worker":  # data x pipeline x model
        tfdist.strategies.configure_logical_cpus(4)  # (2 stages x 2 model devices)
        strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=1)
        parallel = [tfdist.parallel.Pipeline(cuts=["first"], micro_batches=2),
                    _mesh_layout(strategy)]
    else:
        strategy = tfdist.make_strategy(args.strategy)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.RandomState(0)
    x = rng.randn(4096, 6).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    if args.endless_data:
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8, drop_remainder=True)
        epochs, steps_per_epoch = 1, args.steps
    elif args.epoch_steps:
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8).take(
            args.epoch_steps)
        epochs, steps_per_epoch = -(-args.steps // args.epoch_steps), None
    else:
        passes = -(-args.steps // (len(x) // 8))
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(passes)
        epochs, steps_per_epoch = 1, args.steps
    if args.model == "embedding":
        data = _as_padded_token_batches(data, tf)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        if args.model == "embedding":
            model = keras.Sequential([
                keras.Input((None,), dtype="int32"),
                keras.layers.Embedding(50, 8, mask_zero=True, name="first"),
                keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3, activation="softmax"),
            ])
        else:
            model = keras.Sequential([
                keras.Input((6,)), keras.layers.Dense(16, activation="relu", name="first"),
                keras.layers.Dense(3, activation="softmax", name="head"),
            ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      steps_per_execution=args.steps_per_execution)
    communication = None
    if args.local_sgd:
        communication = tfdist.communication.LocalSGD(args.local_sgd)
    elif args.gossip:
        communication = tfdist.communication.Gossip(args.gossip)
    elif args.sharded_state:
        communication = tfdist.communication.ShardedOptimizerState()
    elif args.fully_sharded:
        communication = tfdist.communication.FullySharded()
    trainer = tfdist.Trainer(model, strategy, communication=communication, parallel=parallel,
        checkpointing=tfdist.CheckpointOptions(
            args.checkpoint_dir, max_to_keep=2, every_steps=args.checkpoint_every_steps,
            async_write=args.async_checkpoint),
        input_pipeline=tfdist.DataOptions(data_service=args.data_service),
        reporting=tfdist.ReportingOptions(log_every_steps=args.log_every_steps))
    trainer.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=1)


if __name__ == "__main__":
    flags.mark_flag_as_required("checkpoint_dir")
    app.run(main)
