"""The training program of `scripts/soak.py` (a child program, in scripts/bench/
with the benchmarks' `cluster_program.py`): fast steps for a long time.

Trains a small MLP (6 inputs, 16 hidden, 3 classes) on generated data with
global batch 8 and ``steps_per_execution=1``: the fastest steps this machine
can run, so per-step costs (threads, memory, files) show up quickly. Runs
under ``tfdist-run`` as every worker (MultiWorkerMirroredStrategy) or as the
chief of a parameter-server cluster (``--strategy=parameter_server``), with a
checkpoint every ``--checkpoint_every_steps`` steps, until ``--steps`` are
done or it is stopped (SIGTERM: it saves and exits 143). With
``--epoch_steps=N`` it trains epochs of N steps, each a pass over finite data
with an iterator of its own (made, run out, and freed: what
`tfdist.data.iterator_release` does at every epoch end); by default one epoch.
With ``--endless_data`` the data is ``repeat()``-ed without end, so the
executions run without an end-of-data check (`tfdist.loops.runners.synchronous`).
"""

import argparse

import tfdist


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="multi_worker_mirrored",
                        choices=["multi_worker_mirrored", "parameter_server"])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--checkpoint_every_steps", type=int, default=500)
    parser.add_argument("--log_every_steps", type=int, default=100)
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--epoch_steps", type=int, default=0,
                        help="steps per epoch, each epoch a fresh pass (0: one epoch)")
    parser.add_argument("--async_checkpoint", action="store_true",
                        help="Trainer(async_checkpoint=True): saves written in the background")
    parser.add_argument("--data_service", default=None,
                        help="Trainer(data_service=...): 'auto' under --data_service_workers")
    parser.add_argument("--local_sgd", type=int, default=0,
                        help="Trainer(communication=LocalSGD(every_steps=N)) (0: synchronous)")
    parser.add_argument("--endless_data", action="store_true",
                        help="one epoch over endless data (repeat()): the loop without "
                             "an end-of-data check, also under MWMS")
    parser.add_argument("--model", choices=["mlp", "embedding"], default="mlp",
                        help="embedding: token ids padded per batch to 2..10, "
                             "Embedding(mask_zero=True) + pooling (sparse gradients whose "
                             "all-gathers change shape from step to step)")
    args = parser.parse_args()

    strategy = tfdist.make_strategy(args.strategy)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

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
                keras.layers.Embedding(50, 8, mask_zero=True),
                keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3, activation="softmax"),
            ])
        else:
            model = keras.Sequential([
                keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(3, activation="softmax"),
            ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    trainer = tfdist.Trainer(
        model, strategy, checkpoint_dir=args.checkpoint_dir, max_to_keep=2,
        checkpoint_every_steps=args.checkpoint_every_steps,
        async_checkpoint=args.async_checkpoint, data_service=args.data_service,
        communication=tfdist.communication.LocalSGD(args.local_sgd) if args.local_sgd else None,
        log_every_steps=args.log_every_steps, steps_per_execution=args.steps_per_execution,
    )
    trainer.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=1)


if __name__ == "__main__":
    main()
