"""Benchmark: tensor parallelism from Keras' LayoutMap against data
parallelism on the same devices and against one device: what each device
keeps, what one step sends between devices against what the layout
implies, and the step time.

    python -m scripts.bench tensor_parallel           # width 512, 2 pairs, ~3 min here
    python -m scripts.bench tensor_parallel --quick   # width 32: every path

An MLP of ``--pairs`` Megatron pairs (``Dense(4 x width, relu)`` split by
columns, then ``Dense(width)`` split by rows) between a ``width``-wide
input and a replicated one-unit head, with Adam, on 4 logical CPUs. Each
layout runs in a fresh process:

- ``one_device``: plain ``tfdist.attach`` (no strategy);
- ``data_2``, ``data_4``: MirroredStrategy over 2 or 4 devices;
- ``mesh_1x2``, ``mesh_1x4``, ``mesh_2x2``: ``parallel=ModelParallel``,
  data x model (2x2: MirroredStrategy(2), each replica's weights split
  over its 2 model devices);
- ``pipeline_2``: a ``Pipeline`` of 2 stages (cut after the middle pair),
  4 micro-batches, one device per stage;
- ``mesh_1x2x2``: both, data x pipeline x model: each stage's pair split
  over its own 2 model devices;
- ``data_2_fs``, ``mesh_2x2_fs``: ``data_2`` and ``mesh_2x2`` with
  ``communication=FullySharded()`` (data x model x fully sharded: each
  shard sliced over the 2 replicas).

Reported per layout:

- ``most MB on a device``: weights + Adam's state on the device that keeps
  most (goal on a mesh: the whole model's / the model axis, plus the head);
- ``activation MB``: the bytes of the batch's activations and their
  gradients that cross devices in one traced training step
  (`tfdist.parallel.device_traffic`), against ``implied MB``: per pair and
  direction, the input to each other model device and the partial
  product back (the first pair's input needs no gradient); with a
  pipeline, also the cut's activation and its gradient;
- ``weight-sized MB``: any other tensor with a shape that crosses (goal 0);
- ``all-reduce MB per replica``: what the strategy's collectives reduce;
  ``gather MB per replica``: what fully sharded weights' collectives
  gather and reduce-scatter (their operands' bytes, a replica's slices);
- ``ms per step``: the median over ``--rounds`` of ``--steps`` steps of
  ``fit``. The 4 logical CPUs share this machine's 2 cores, so step times
  say what the split costs, not what separate devices would gain.

Across processes (``--workers``, a second table): 2 workers under
``tfdist-run --num_workers=2 --bandwidth=RATE`` (``--bandwidths``; each
layout a cluster of its own) on a simulated link, each worker 2 logical
CPUs:

- ``workers_data``: MultiWorkerMirroredStrategy, one replica per worker;
- ``workers_mesh_2x2``: the same strategy as the mesh's data axis, each
  worker's weights split over its 2 CPUs (`tfdist.parallel.mesh_devices`).

Reported: ``link MB per step`` (what the namespace's loopback carried in
the timed rounds, per step: every task's traffic once), against ``bound
MB``, what a ring all-reduce of the gradients sends over the link
(2 (N - 1) / N of them per worker, N workers' sends); ``ms per step``
against the link's time for that (``bound ms``).

    python -m scripts.bench tensor_parallel --workers --bandwidths=1gbit

Outputs in ``--output_dir``: tensor_parallel_benchmark.json and .md.
"""

import json
import pathlib
import subprocess
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, limited_cluster, measure, outputs  # noqa: E402
from tfdist.launch import network  # noqa: E402

bench_flags.define_common("tensor_parallel_benchmark",
                          quick="width 32, batches of 48, 2 steps per round.")
flags.DEFINE_integer("width", 512, "The model's width (the pairs' hidden layers are 4x).")
flags.DEFINE_integer("pairs", 2, "Column-then-row Dense pairs.")
flags.DEFINE_integer("batch_size", 64, "Rows per global batch.")
flags.DEFINE_integer("steps", 20, "Steps per timed round.")
flags.DEFINE_integer("rounds", 5, "Timed rounds (the median is reported).")
flags.DEFINE_list("layouts", ["one_device", "data_2", "data_4", "mesh_1x2", "mesh_1x4",
                              "mesh_2x2", "pipeline_2", "mesh_1x2x2", "data_2_fs",
                              "mesh_2x2_fs"],
                  "The layouts measured, each in a fresh process.")
flags.DEFINE_bool("workers", False, "Measure the 2-worker layouts on a simulated link.")
flags.DEFINE_list("bandwidths", ["1gbit"], "With --workers: the link rates (tc), one cluster "
                  "per rate and layout.")
flags.DEFINE_string("run_of", None, "(internal) measure one layout in this process.")
flags.DEFINE_string("worker_output", None, "(internal) where a cluster's chief writes its row.")
FLAGS = flags.FLAGS
MICRO_BATCHES = 4  # (a pipeline's, per batch)


def _model(keras, width: int, pairs: int):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((width,))]
    for index in range(pairs):
        layers += [keras.layers.Dense(4 * width, activation="relu", name=f"up{index}"),
                   keras.layers.Dense(width, name=f"down{index}")]
    model = keras.Sequential(layers + [keras.layers.Dense(1, name="head")])
    model.compile(optimizer=keras.optimizers.Adam(0.001), loss="mse")
    return model


def measure_one(layout: str) -> dict:
    """One layout, in this process."""
    import tfdist  # pylint: disable=import-outside-toplevel

    devices = tfdist.strategies.configure_logical_cpus(4)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist.parallel import device_traffic, tensor_parallel  # pylint: disable=import-outside-toplevel
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    width = 32 if FLAGS.quick else FLAGS.width
    sliced = layout.endswith("_fs")
    data, stages, model_axis = {
        "one_device": (1, 1, 1), "data_2": (2, 1, 1), "data_4": (4, 1, 1),
        "mesh_1x2": (1, 1, 2), "mesh_1x4": (1, 1, 4), "mesh_2x2": (2, 1, 2),
        "pipeline_2": (1, 2, 1), "mesh_1x2x2": (1, 2, 2)}[layout.removesuffix("_fs")]
    per_row = stages * model_axis
    replica_devices = devices[:data * per_row:per_row]  # (the mesh's first column)
    strategy = (tfdist.make_strategy("mirrored", devices=replica_devices) if data > 1
                else None)
    with strategy.scope() if strategy else tf.init_scope():
        model = _model(keras, width, FLAGS.pairs)
    ways = []
    if stages > 1:
        ways.append(tfdist.parallel.Pipeline(cuts=[f"down{FLAGS.pairs // 2 - 1}"],
                                             micro_batches=MICRO_BATCHES))
    if model_axis > 1:
        shape, names = ((data, model_axis), ["batch", "model"]) if stages == 1 else (
            (data, stages, model_axis), ["batch", "pipeline", "model"])
        mesh = keras.distribution.DeviceMesh(shape, names, devices[:data * per_row])
        ways.append(keras.distribution.ModelParallel(layout_map=_rules(keras, mesh),
                                                     batch_dim_name="batch"))
    tfdist.attach(model, strategy, parallel=ways[0] if len(ways) == 1 else ways or None,
                  communication=tfdist.communication.FullySharded() if sliced else None)
    # (quick: 48 rows, so that no activation's shape is a width-32 weight's)
    rows = 48 if FLAGS.quick else FLAGS.batch_size
    x = np.random.default_rng(0).random((rows, width), "float32")
    y = x.sum(axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    steps = 2 if FLAGS.quick else FLAGS.steps
    model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)  # (traced, built)
    seconds = []
    for _ in range(1 if FLAGS.quick else FLAGS.rounds):
        start = time.perf_counter()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        seconds.append((time.perf_counter() - start) / steps)
    per_replica = rows // data
    step = keras_fit.attachment_of(model).trainer()._steps.train  # pylint: disable=protected-access
    def batch(_=None):  # (made on each replica's device, as fit's distributed batches are)
        return tfdist.Batch(tf.constant(x[:per_replica]),
                            tf.constant(y[:per_replica])).to_structure()

    if strategy is not None:
        batch = strategy.experimental_distribute_values_from_function(batch)
        graph = tf.function(lambda s: strategy.run(step, args=(s,))).get_concrete_function(
            batch).graph
    else:
        graph = tf.function(step).get_concrete_function(batch()).graph
    home = {tf.DeviceSpec.from_string(d).device_index or 0 for d in replica_devices[:data]}

    def fed(crossing):  # (a batch's input to its own replica: the traced step's feeding)
        placeholder = graph.get_tensor_by_name(crossing.tensor).op.type == "Placeholder"
        return placeholder and tf.DeviceSpec.from_string(crossing.destination).device_index in home

    crossings = [c for c in device_traffic.crossings(graph, default_device="/cpu:0")
                 if c.shape and c.bytes and not fed(c)]
    variables = (tensor_parallel.trainable_variables(model.trainable_weights)
                 + model.non_trainable_weights + model.optimizer.variables)
    weight_shapes = {tuple(v.shape) for v in variables}
    rows_crossing = {per_replica, per_replica // MICRO_BATCHES}  # (a batch's; a micro-batch's)
    activations = [c for c in crossings if c.shape[0] in rows_crossing
                   and tuple(c.shape) not in weight_shapes]
    def operand_bytes(types):
        return sum(int(np.prod(op.inputs[0].shape)) * op.inputs[0].dtype.size
                   for op in graph.get_operations() if op.type in types)

    reduced = operand_bytes(("CollectiveReduceV2",))
    gathered = operand_bytes(("CollectiveGatherV2", "CollectiveAllToAllV2"))
    activation_bytes = per_replica * width * 4
    implied = (data * (model_axis - 1) * activation_bytes * (4 * FLAGS.pairs - 1)
               + (stages - 1) * 2 * activation_bytes)  # (a pipeline's cut, both ways)
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)
    return {"layout": layout, "width": width, "weights_mb": weights / 2**20,
            "most_kept_on_a_device_mb": max(measure.kept_by_device(variables).values()) / 2**20,
            "activation_mb": sum(c.bytes for c in activations) / 2**20,
            "implied_mb": implied / 2**20,
            "weight_sized_mb": sum(c.bytes for c in crossings if c not in activations) / 2**20,
            "all_reduce_mb_per_replica": reduced / data / 2**20,
            "gather_mb_per_replica": gathered / data / 2**20,
            "ms_per_step": 1000 * float(np.median(seconds))}


def measure_on_worker(layout: str) -> dict:
    """One 2-worker layout, on this worker (under tfdist-run)."""
    import tfdist  # pylint: disable=import-outside-toplevel

    tfdist.strategies.configure_logical_cpus(2)
    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=1)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist.parallel import tensor_parallel  # pylint: disable=import-outside-toplevel

    width = 32 if FLAGS.quick else FLAGS.width
    with strategy.scope():
        model = _model(keras, width, FLAGS.pairs)
    parallel = None
    if layout == "workers_mesh_2x2":
        mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"],
                                             tfdist.parallel.mesh_devices(strategy, 2))
        parallel = keras.distribution.ModelParallel(layout_map=_rules(keras, mesh),
                                                    batch_dim_name="batch")
    tfdist.attach(model, strategy, parallel=parallel)
    x = np.random.default_rng(0).random((FLAGS.batch_size, width), "float32")
    dataset = tf.data.Dataset.from_tensors((x, x.sum(axis=1, keepdims=True))).repeat()
    steps = 2 if FLAGS.quick else FLAGS.steps
    model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)  # (traced, built)
    seconds, link = [], []
    for _ in range(1 if FLAGS.quick else FLAGS.rounds):
        sent = limited_cluster.loopback_bytes()
        start = time.perf_counter()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        seconds.append((time.perf_counter() - start) / steps)
        link.append((limited_cluster.loopback_bytes() - sent) / steps)
    variables = (tensor_parallel.trainable_variables(model.trainable_weights)
                 + model.non_trainable_weights + model.optimizer.variables)
    gradients = sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)
    return {"layout": layout, "width": width, "weights_mb": gradients / 2**20,
            "most_kept_on_a_device_mb": max(measure.kept_by_device(variables).values()) / 2**20,
            "link_mb_per_step": float(np.median(link)) / 2**20,
            "bound_mb": 2 * gradients / 2**20,  # (2 workers: each sends (N-1)/N x 2 of them)
            "ms_per_step": 1000 * float(np.median(seconds))}


def _rules(keras, mesh):
    rules = keras.distribution.LayoutMap(mesh)
    rules[".*/up\\d+/kernel"] = (None, "model")
    rules[".*/down\\d+/kernel"] = ("model", None)
    return rules


def _on_workers(bandwidth: str, layout: str) -> dict:
    """``layout`` measured by a 2-worker cluster on a ``bandwidth`` link."""
    output = pathlib.Path(FLAGS.output_dir) / f"raw-{layout}-{bandwidth}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tfdist.launch", "--num_workers=2",
               f"--bandwidth={bandwidth}", "--", sys.executable, __file__,
               f"--run_of={layout}", f"--worker_output={output}", f"--quick={FLAGS.quick}",
               f"--width={FLAGS.width}", f"--pairs={FLAGS.pairs}",
               f"--batch_size={FLAGS.batch_size}", f"--steps={FLAGS.steps}",
               f"--rounds={FLAGS.rounds}"]
    subprocess.run(command, cwd=pathlib.Path(__file__).resolve().parents[1], check=True,
                   timeout=1800)
    row = json.loads(output.read_text())
    row["bandwidth"] = bandwidth
    row["bound_ms"] = 1000 * row["bound_mb"] * 2**20 * 8 / network.bits_per_second(bandwidth)
    return row


def _workers_table(rows) -> str:
    lines = ["| layout | link | most weights + state MB on a device | link MB per step | "
             "bound MB | ms per step | bound ms |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['bandwidth']} | {r['most_kept_on_a_device_mb']:.2f} | "
              f"{r['link_mb_per_step']:.2f} | {r['bound_mb']:.2f} | {r['ms_per_step']:.1f} | "
              f"{r['bound_ms']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.run_of and FLAGS.run_of.startswith("workers_"):
        row = measure_on_worker(FLAGS.run_of)
        import tfdist  # pylint: disable=import-outside-toplevel

        if tfdist.cluster.is_chief():
            pathlib.Path(FLAGS.worker_output).write_text(json.dumps(row))
        return 0
    if FLAGS.run_of:
        print(json.dumps(measure_one(FLAGS.run_of)))
        return 0
    if FLAGS.workers:
        rows = [_on_workers(bandwidth, layout) for bandwidth in FLAGS.bandwidths
                for layout in ("workers_data", "workers_mesh_2x2")]
        table = _workers_table(rows)
        outputs.write_results(FLAGS.output_dir, "tensor_parallel_benchmark", {"rows": rows},
                              table)
        print(table)
        return 0
    layouts = ["one_device", "data_2", "mesh_1x2", "mesh_2x2", "mesh_1x2x2",
               "mesh_2x2_fs"] if FLAGS.quick else FLAGS.layouts
    rows = []
    for layout in layouts:
        command = [sys.executable, __file__, f"--run_of={layout}", f"--quick={FLAGS.quick}",
                   f"--width={FLAGS.width}", f"--pairs={FLAGS.pairs}",
                   f"--batch_size={FLAGS.batch_size}", f"--steps={FLAGS.steps}",
                   f"--rounds={FLAGS.rounds}"]
        rows.append(measure.row_in_fresh_process(command))
        print(rows[-1], flush=True)
    one = next((r for r in rows if r["layout"] == "one_device"), None)
    lines = ["| layout | weights MB | most weights + state MB on a device | activation MB "
             "between devices | implied MB | weight-sized MB | all-reduce MB per replica | "
             "gather MB per replica | ms per step | vs one device |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['weights_mb']:.2f} | {r['most_kept_on_a_device_mb']:.2f} | "
              f"{r['activation_mb']:.2f} | {r['implied_mb']:.2f} | {r['weight_sized_mb']:.2f} | "
              f"{r['all_reduce_mb_per_replica']:.2f} | "
              f"{r.get('gather_mb_per_replica', 0.0):.2f} | {r['ms_per_step']:.1f} | "
              + (f"{r['ms_per_step'] / one['ms_per_step']:.2f}x |" if one else "- |")
              for r in rows]
    table = "\n".join(lines) + "\n"
    outputs.write_results(FLAGS.output_dir, "tensor_parallel_benchmark", {"rows": rows}, table)
    print(table)
    return 0


if __name__ == "__main__":
    app.run(main)
