"""Benchmark: what one training step of data x pipeline sends between
devices, read from the traced step (`tfdist.parallel.device_traffic`),
as m grows.

    python -m scripts.bench pipeline_traffic           # d = 2, S = 2, m = 2, 4, 8
    python -m scripts.bench pipeline_traffic --quick   # a narrow model, m = 2

An MLP of ``--layers`` hidden layers of ``--width`` units cut into 2
stages, on 2 x 2 logical CPUs: MirroredStrategy(2), each replica a
pipeline of its own (`tfdist.parallel.pipeline`). Each m runs in a fresh
process, which traces the Trainer's replica step on a batch of
``--micro_batch_rows`` x m rows per replica and sums, without running it:

- ``weights-sized MB``: bytes of the tensors that cross devices and do
  not have the micro-batch's rows (weights, gradients, optimizer values);
- ``per-row MB``: the micro-batches' activations, their gradients and the
  rows' targets and outputs between a replica's stages;
- ``all-reduce MB``: what the strategy's collectives reduce per replica
  (each replica sends and receives about this much in a ring).

``--layout=fully_sharded`` adds ``communication=FullySharded()``: each
stage's weights, gradients and optimizer state sharded over the 2
replicas (gathered once per step on the stage's devices, the summed
gradient reduce-scattered once). Every layout also reports the largest
``weights + state MB`` any one device keeps (``--optimizer=adam``: two
moments per weight) and what the gathers and reduce-scatters send.

``--layout=replicas`` measures ``Pipeline(replicas=2)`` instead (2
pipelines inside one replica, every later pipeline reading each weight
from the first pipeline's device per micro-batch), which tfdist
retired: run it with a checkout that still has it first on ``PYTHONPATH``.

Outputs in ``--output_dir``: pipeline_traffic_benchmark.json and .md.
"""

import json
import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("pipeline_traffic_benchmark", quick="width 32, m = 2.")
flags.DEFINE_integer("width", 512, "Units per hidden layer.")
flags.DEFINE_integer("layers", 4, "Hidden layers (even: 2 stages).")
flags.DEFINE_integer("micro_batch_rows", 32, "Rows per micro-batch.")
flags.DEFINE_list("micro_batches", ["2", "4", "8"], "Micro-batch counts m.")
flags.DEFINE_enum("layout", "strategy", ["strategy", "fully_sharded", "replicas"],
                  "strategy: MirroredStrategy(2), a pipeline per replica; fully_sharded: "
                  "the same with FullySharded(); replicas: the retired Pipeline(replicas=2).")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "adam"], "The optimizer (its state per device).")
flags.DEFINE_integer("run_of", None, "(internal) measure one m in this process.")
FLAGS = flags.FLAGS
FEATURES = 8


def measure_one(micro_batches: int) -> dict:
    """One m, in this process."""
    import tfdist  # pylint: disable=import-outside-toplevel

    tfdist.strategies.configure_logical_cpus(4)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist.parallel import device_traffic  # pylint: disable=import-outside-toplevel
    from tfdist.training.trainer import Trainer  # pylint: disable=import-outside-toplevel

    width = 32 if FLAGS.quick else FLAGS.width
    layers, rows = FLAGS.layers, FLAGS.micro_batch_rows
    replicated = FLAGS.layout != "replicas"
    strategy = (tfdist.make_strategy("mirrored", num_replicas=2)
                if replicated else tf.distribute.get_strategy())
    with strategy.scope():
        keras.utils.set_random_seed(1)
        hidden = [keras.layers.Dense(width, "tanh", name=f"hidden{i}") for i in range(layers)]
        model = keras.Sequential([keras.Input((FEATURES,))] + hidden
                                 + [keras.layers.Dense(1, name="out")])
        optimizer = (keras.optimizers.SGD(0.01) if FLAGS.optimizer == "sgd"
                     else keras.optimizers.Adam(0.001))
        model.compile(optimizer=optimizer, loss="mse")
    options = {} if replicated else {"replicas": 2}
    pipeline = tfdist.parallel.Pipeline(cuts=[f"hidden{layers // 2 - 1}"],
                                        micro_batches=micro_batches, **options)
    communication = (tfdist.communication.FullySharded() if FLAGS.layout == "fully_sharded"
                     else None)
    trainer = Trainer(model, strategy, parallel=pipeline, communication=communication)
    per_replica = rows * micro_batches
    global_batch = 2 * per_replica
    x = np.random.default_rng(0).random((global_batch, FEATURES), "float32")
    y = x.sum(axis=1, keepdims=True)
    trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch), epochs=1,
                verbose=0)
    traced_rows = per_replica if replicated else global_batch
    batch = tfdist.Batch(tf.constant(x[:traced_rows]), tf.constant(y[:traced_rows]))
    if replicated:
        batch = strategy.experimental_distribute_values_from_function(
            lambda _: batch.to_structure())
    else:
        batch = batch.to_structure()
    steps = trainer._steps  # pylint: disable=protected-access
    step = tf.function(lambda structure: strategy.run(steps.train, args=(structure,)))
    graph = step.get_concrete_function(batch).graph
    crossings = device_traffic.crossings(graph, default_device="/cpu:0")
    per_row = [c for c in crossings if c.shape and c.shape[0] == rows]
    other = [c for c in crossings if c not in per_row and c.bytes]
    reduced = sum(int(np.prod(op.inputs[0].shape)) * op.inputs[0].dtype.size
                  for op in graph.get_operations() if op.type == "CollectiveReduceV2")
    def sent(kind):  # (per replica: each sends its input once)
        return sum(int(np.prod(op.inputs[0].shape)) * op.inputs[0].dtype.size
                   for op in graph.get_operations() if op.type == kind) / 2

    weights = sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)
    return {"layout": FLAGS.layout, "optimizer": FLAGS.optimizer,
            "micro_batches": micro_batches, "weights_mb": weights / 2**20,
            "most_kept_on_a_device_mb": max(measure.kept_by_device(
                model.weights + model.optimizer.variables).values()) / 2**20,
            "gathered_mb_per_replica": sent("CollectiveGatherV2") / 2**20,
            "reduce_scattered_mb_per_replica": sent("CollectiveAllToAllV2") / 2**20,
            "weight_sized_mb": sum(c.bytes for c in other) / 2**20,
            "per_row_mb": sum(c.bytes or 0 for c in per_row) / 2**20,
            "all_reduce_mb_per_replica": reduced / 2 / 2**20}


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.run_of:
        print(json.dumps(measure_one(FLAGS.run_of)))
        return 0
    counts = ["2"] if FLAGS.quick else FLAGS.micro_batches
    rows = []
    for micro_batches in counts:
        rows.append(measure.run_own_form(
            __file__, f"--run_of={micro_batches}",
            ["quick", "width", "layers", "micro_batch_rows", "layout", "optimizer"]))
    lines = ["| layout | optimizer | m | weights MB | most weights + state MB on a device | "
             "weight-sized MB between devices | per-row MB | all-reduce MB per replica | "
             "gathered MB per replica | reduce-scattered MB per replica |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['optimizer']} | {r['micro_batches']} | "
              f"{r['weights_mb']:.2f} | {r['most_kept_on_a_device_mb']:.2f} | "
              f"{r['weight_sized_mb']:.2f} | {r['per_row_mb']:.2f} | "
              f"{r['all_reduce_mb_per_replica']:.2f} | {r['gathered_mb_per_replica']:.2f} | "
              f"{r['reduce_scattered_mb_per_replica']:.2f} |" for r in rows]
    table = "\n".join(lines) + "\n"
    outputs.write_results(FLAGS.output_dir, "pipeline_traffic_benchmark", {"rows": rows}, table)
    print(table)
    return 0


if __name__ == "__main__":
    app.run(main)
