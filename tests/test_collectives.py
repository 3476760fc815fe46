"""`tfdist.collectives.function`: tfdist's functions keep the collective
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
    from tfdist import collectives

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
