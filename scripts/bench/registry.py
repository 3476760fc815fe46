"""Every measuring tool, by name: the benchmark suite and the reliability tools.

`python -m scripts.bench NAME [flags]` runs one (`scripts.bench.__main__`);
``python -m scripts.bench`` lists them. Each benchmark takes the common
``--quick`` (every code path, not a measurement) and ``--output_dir``
(`scripts.bench.flags`); its run times and figures are on the docs site
(docs/performance.md, docs/reliability.md), stated there once.
"""

import dataclasses
from typing import Dict


@dataclasses.dataclass(frozen=True)
class Tool:
    """One measuring program: ``scripts/<script>`` and what it measures."""

    script: str
    kind: str  # "benchmark" (speed, memory) or "reliability" (soak, chaos, conformance)
    measures: str


TOOLS: Dict[str, Tool] = {
    "training": Tool("benchmark.py", "benchmark",
                     "tfdist against Keras fit and a hand-written loop, every strategy"),
    "allreduce": Tool("allreduce_benchmark.py", "benchmark",
                      "the gradient all-reduce on a simulated network, against its bound"),
    "compression": Tool("compression_benchmark.py", "benchmark",
                        "16-bit gradient compression on a slow network: time and accuracy"),
    "time_to_accuracy": Tool("time_to_accuracy.py", "benchmark",
                             "local SGD and compression: time to a target accuracy"),
    "checkpoint": Tool("checkpoint_benchmark.py", "benchmark",
                       "the cost of saves, synchronous and in the background"),
    "sharding": Tool("sharding_benchmark.py", "benchmark",
                     "sharded optimizer state: state and peak memory per replica, step time"),
    "sharding_cluster": Tool("sharding_cluster_benchmark.py", "benchmark",
                             "sharded optimizer state on real workers: memory per worker, "
                             "step time on a slow network against the ring bound"),
    "memory_budget": Tool("memory_budget_benchmark.py", "benchmark",
                          "a model 1.5x one worker's memory budget: plain runs out of memory, "
                          "fully sharded weights train"),
    "pipeline": Tool("pipeline_benchmark.py", "benchmark",
                     "pipeline stages: weights and state per stage, the live-tensor peak "
                     "of GPipe and 1F1B as the micro-batches grow"),
    "pipeline_bubble": Tool("pipeline_bubble_benchmark.py", "benchmark",
                            "a pipeline's bubble: each stage's busy and idle time per step "
                            "from in-graph timestamps, against (S-1)/(m+S-1)"),
    "pipeline_cluster": Tool("pipeline_cluster_benchmark.py", "benchmark",
                             "one pipeline stage per process on a slow network and unlimited, "
                             "against one process; activation bytes against the link's bound"),
    "pipeline_traffic": Tool("pipeline_traffic_benchmark.py", "benchmark",
                             "data x pipeline: the bytes one step sends between devices "
                             "(weights-sized, per-row, all-reduced), read from the traced step"),
    "tensor_parallel": Tool("tensor_parallel_benchmark.py", "benchmark",
                            "tensor parallelism from a LayoutMap against data parallelism and "
                            "one device: memory per device, bytes per step, step time"),
    "sequence_parallel": Tool("sequence_parallel_benchmark.py", "benchmark",
                              "sequence parallelism against tensor parallelism alone and one "
                              "device: forward bytes per device, bytes between devices, "
                              "step time"),
    "tables": Tool("tables_benchmark.py", "benchmark",
                   "an embedding step's time against the table's rows: Keras fit, tfdist on "
                   "one device and on 2 replicas, SGD and Adagrad"),
    "tables_cluster": Tool("tables_cluster_benchmark.py", "benchmark",
                           "an embedding table on 2 workers, replicated and sharded by rows: "
                           "bytes on the link against the ids' and vectors', step time on a "
                           "slow network"),
    "gossip": Tool("gossip_benchmark.py", "benchmark",
                   "decentralized SGD (ring, exponential graph) against all-reduce SGD and "
                   "local SGD on 4 workers of a slow network: time to accuracy, bytes per "
                   "worker, the workers' spread"),
    "data_service": Tool("data_service_benchmark.py", "benchmark",
                         "input preprocessing on tf.data service workers"),
    "keras_vs_tfdist": Tool("keras_vs_tfdist.py", "benchmark",
                            "exactness: Keras fit under a strategy against tfdist.attach"),
    "soak": Tool("soak.py", "reliability", "threads, RSS and files over a long run"),
    "chaos": Tool("chaos.py", "reliability", "random SIGKILL / SIGTERM / SIGSTOP, exact resume"),
    "conformance": Tool("conformance.py", "reliability",
                        "every model family on every strategy and batch shape"),
}
