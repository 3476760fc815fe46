"""How much memory TensorFlow's multi-worker runtime keeps per host call,
by the collective ops in the call (no tfdist code in the measured loop).

    python scripts/collective_memory.py --mode=separate:1   # 1 all-reduce per call
    python scripts/collective_memory.py --mode=separate:4   # 4 all-reduces per call
    python scripts/collective_memory.py --mode=batched:4    # 4 tensors, 1 all-reduce
    python scripts/collective_memory.py --mode=loop:4       # 1 all-reduce, 4 times in tf.range
    python scripts/collective_memory.py --mode=none         # no collective

Starts 2 worker processes with TF_CONFIG on 127.0.0.1 (MultiWorkerMirrored,
one CPU each); each calls a ``tf.function`` ``--calls`` times and prints the
least-squares slope of its resident memory (KB per call) after the first
quarter. Measured 2026-11-23 (20,000 calls): 1.6, 6.5, 1.6, 1.6 and 0 KB per
call: the memory is kept per collective op per call, not per execution of
it. This is why tfdist agrees on stop requests in a call of its own, about
once a second (`tfdist.loops.agreement`), and why ``steps_per_execution`` divides
the residue (README "Reliability").

Why (read in TensorFlow's source, not yet confirmed by a debugger):
``CollectiveReplicaLauncher`` takes a new collective instance key at every
call (``_prefer_unique_instance_key``), and each worker's param resolver
caches a record per instance key that it never erases.
``--fixed_instance_keys`` turns that private flag off (keys fixed at trace
time): measured 0.01 KB per call with ``--mode=separate:4`` (6.5 without),
at about twice the calls per second. TensorFlow prefers unique keys so that
workers need not trace in the same order; tfdist's own functions fix their
keys while they trace (`tfdist.replica.collectives.function`).
"""

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resident_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measured_function(strategy, mode: str):
    """The ``tf.function`` of one host call for ``mode``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    kind, _, count = mode.partition(":")
    count = int(count or 1)

    @tf.autograph.experimental.do_not_convert
    def replica_fn():
        context = tf.distribute.get_replica_context()
        value = tf.ones([16])
        if kind == "none":
            return tf.reduce_sum(value)
        if kind == "separate":
            return [context.all_reduce("sum", value + i) for i in range(count)]
        if kind == "batched":
            return context.all_reduce("sum", [value + i for i in range(count)])
        return context.all_reduce("sum", value)  # loop

    @tf.function
    def call():
        if kind != "loop":
            return strategy.run(replica_fn)
        total = tf.zeros([16])
        for _ in tf.range(count):
            total += strategy.experimental_local_results(strategy.run(replica_fn))[0]
        return total

    return call


def worker(mode: str, calls: int, fixed_instance_keys: bool) -> None:
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if fixed_instance_keys:  # private TensorFlow flag; see the module docstring
        from tensorflow.python.distribute import cross_device_utils  # pylint: disable=import-outside-toplevel
        cross_device_utils.CollectiveReplicaLauncher._prefer_unique_instance_key = False  # pylint: disable=protected-access

    call = measured_function(tf.distribute.MultiWorkerMirroredStrategy(), mode)
    samples, started = [], time.monotonic()
    for index in range(calls):
        call()
        if index % 1000 == 0:
            samples.append((index, resident_kb()))
    kept = np.array(samples[len(samples) // 4:], dtype=float)
    slope = np.polyfit(kept[:, 0], kept[:, 1], 1)[0]
    print(json.dumps({"mode": mode, "worker": json.loads(os.environ["TF_CONFIG"])["task"]["index"],
                      "kb_per_call": round(float(slope), 2),
                      "seconds": round(time.monotonic() - started, 1)}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mode", default="separate:1")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--fixed_instance_keys", action="store_true",
                        help="collective instance keys fixed at trace time (not per call)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mode, args.calls, args.fixed_instance_keys)
        return 0
    sys.path.insert(0, REPO)
    from tfdist.launch.ports import free_ports  # pylint: disable=import-outside-toplevel

    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    try:
        for index in range(2):
            tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(tf_config))
            processes.append(subprocess.Popen(
                [sys.executable, __file__, f"--mode={args.mode}", f"--calls={args.calls}",
                 "--worker"] + (["--fixed_instance_keys"] if args.fixed_instance_keys else []),
                env=env, start_new_session=True))
        return max(process.wait(timeout=1800) for process in processes)
    finally:
        for process in processes:  # ended by pid, also on failure
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()


if __name__ == "__main__":
    sys.exit(main())
