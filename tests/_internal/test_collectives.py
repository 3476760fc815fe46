"""`tfdist._internal.collectives.function`: tfdist's functions keep the collective
instance keys of their trace, so a multi-worker call leaves no per-call
record behind (TensorFlow's default takes a new key at every call)."""

import json
import subprocess
import sys
import textwrap


_PROGRAM = textwrap.dedent("""
    import json
    import tensorflow as tf
    from tensorflow.python.distribute import cross_device_utils
    import tfdist
    from tfdist._internal import collectives

    # One local worker with 2 logical CPUs (one device would skip collectives).
    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=2)
    table = strategy.extended._collective_keys._instance_key_table

    def keys_taken():
        return sum(sum(per_device.values()) for per_device in table.values())

    def reduce_one():
        return collectives.sum_over_replicas(strategy, 1.0)

    taken = {}
    for name, function in (("tfdist", collectives.function(reduce_one)),
                           ("tf.function", tf.function(reduce_one))):
        assert float(function()) == strategy.num_replicas_in_sync  # traced here
        before = keys_taken()
        for _ in range(3):
            assert float(function()) == strategy.num_replicas_in_sync
        taken[name] = keys_taken() - before
    taken["flag_after"] = cross_device_utils.CollectiveReplicaLauncher._prefer_unique_instance_key
    print(json.dumps(taken))
""")


def test_tfdist_functions_keep_their_instance_keys_and_leave_tensorflows_default_alone():
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    taken = json.loads(done.stdout.strip().splitlines()[-1])
    assert taken["tfdist"] == 0  # keys fixed when traced: nothing new per call
    assert taken["tf.function"] == 3 * 2  # TensorFlow's default: new keys per call, per replica
    assert taken["flag_after"] is True  # restored for everyone else's functions


_TRAINER_PROGRAM = textwrap.dedent("""
    import json, sys
    import keras
    import numpy as np
    import tensorflow as tf
    import tfdist

    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=2)
    table = strategy.extended._collective_keys._instance_key_table

    def keys_taken():
        return sum(sum(per_device.values()) for per_device in table.values())

    rng = np.random.RandomState(0)
    x = rng.randn(64, 6).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    taken = []

    class Keys(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            taken.append(keys_taken())

    trainer = tfdist.Trainer(model, strategy,
                             checkpointing=tfdist.CheckpointOptions(sys.argv[1], every_steps=3),
                             reporting=tfdist.ReportingOptions(log_every_steps=2))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    trainer.fit(data, epochs=4, callbacks=[Keys()], verbose=1)
    print(json.dumps(taken))
""")


def test_a_warmed_up_trainer_takes_no_instance_keys(tmp_path):
    """Epochs 3 and 4 of `Trainer.fit` under MultiWorkerMirroredStrategy
    (one worker, 2 replicas): steps, a progress line with its example rate
    every 2 steps, a checkpoint every 3 (replica-local metric totals
    included), the metric reset at the epoch's start and the epoch's
    results. None may take a new collective instance key: each would keep a
    record for the rest of the run (a log point's eager example-count read
    did, until it moved into the traced metric read)."""
    done = subprocess.run([sys.executable, "-c", _TRAINER_PROGRAM, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train | epoch 4 | step 8/8" in done.stdout  # progress lines were written
    taken = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(taken) == 4
    assert taken[3] - taken[1] == 0, taken


_VARIABLE_SHAPES_PROGRAM = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    import tfdist
    from tfdist._internal import collectives

    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=2)
    table = strategy.extended._collective_keys._instance_key_table

    def keys_taken():
        return sum(sum(per_device.values()) for per_device in table.values())

    @collectives.function
    def gather(rows):
        # Each replica gathers its first `rows` rows (a shape that changes at
        # every call) and an IndexedSlices-style sum of them.
        def replica():
            context = tf.distribute.get_replica_context()
            values = tf.ones([rows, 3]) * tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
            return context.all_gather(values, axis=0), context.all_reduce("sum", values)
        gathered, summed = strategy.run(replica)
        return strategy.experimental_local_results(gathered)[0], strategy.experimental_local_results(summed)[0]

    gather(tf.constant(5))  # traced here
    before = keys_taken()
    for rows in [1, 7, 2, 33, 8, 64, 3, 1000]:
        gathered, summed = gather(tf.constant(rows))
        want = np.concatenate([np.ones([rows, 3]), 2 * np.ones([rows, 3])])
        assert np.array_equal(gathered.numpy(), want), rows
        assert np.array_equal(summed.numpy(), 3 * np.ones([rows, 3])), rows
    print(json.dumps({"keys_after_trace": keys_taken() - before}))
""")


def test_collectives_whose_shape_changes_each_call_keep_fixed_keys():
    """Under fixed instance keys, a worker keeps one shape per key; gathers
    and all-reduces whose shape changes from call to call (an Embedding's
    sparse gradient on a partial or padded batch) used to fail with
    "Shape mismatch in the collective instance". They now run on a copy
    padded to a power of two, with that size's key: right results for every
    shape, and no key taken after the trace."""
    completed = subprocess.run([sys.executable, "-c", _VARIABLE_SHAPES_PROGRAM],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == {"keys_after_trace": 0}
