"""Benchmark: sequence parallelism (Megatron-LM's, from ``"<path>/output"``
rules of Keras' LayoutMap) against plain tensor parallelism on the same
mesh and against one device: where a step's activations are computed,
what it sends between devices, and the step time.

    python -m scripts.bench sequence_parallel           # ~2 min here
    python -m scripts.bench sequence_parallel --quick   # every path

A stack of ``--blocks`` pre-norm transformer blocks (``LayerNormalization``,
``MultiHeadAttention`` split by heads, ``Add``, ``LayerNormalization``, a
``Dense`` pair split by columns then rows, ``Add``) on inputs of
``--sequence`` positions x ``--width`` features, pooled into a one-unit
head, with Adam, on 4 logical CPUs. Each layout runs in a fresh process:

- ``one_device``: plain ``tfdist.attach``;
- ``mesh_1x2``, ``mesh_1x4``: tensor parallelism alone (the replicated
  region, norms and sums, runs whole on the first model device);
- ``mesh_1x2_sp``, ``mesh_1x4_sp``: the same with the region's outputs
  split by sequence, ``("batch", "model", None)``.

Reported per layout, read from the traced training step:

- ``kept MB on the first device`` and ``most kept MB on a device``: the
  bytes of the forward pass' tensors that the backward pass reads (the
  activations a step keeps from one to the other), by the device that
  computed them (the logical CPUs share one allocator, so no peak is
  measured);
- ``activation MB between devices``: the bytes of the tensors of the
  batch's rows that cross devices in one step, forward and backward;
- ``ms per step``: the median over ``--rounds`` of ``--steps`` steps of
  ``fit``. The 4 logical CPUs share this machine's 2 cores: step times say
  what the split costs, not what separate devices would gain.

Outputs in ``--output_dir``: sequence_parallel_benchmark.json and .md.
"""

import pathlib
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import flags as bench_flags, measure, outputs  # noqa: E402

bench_flags.define_common("sequence_parallel_benchmark",
                          quick="width 16, 8 positions, 1 block, 2 steps per round.")
flags.DEFINE_integer("width", 256, "Features per position (the feed-forward's hidden: 4x).")
flags.DEFINE_integer("sequence", 128, "Positions per example.")
flags.DEFINE_integer("blocks", 2, "Pre-norm transformer blocks.")
flags.DEFINE_integer("heads", 8, "Attention heads.")
flags.DEFINE_integer("batch_size", 16, "Rows per batch.")
flags.DEFINE_integer("steps", 10, "Steps per timed round.")
flags.DEFINE_integer("rounds", 3, "Timed rounds (the median is reported).")
flags.DEFINE_list("layouts", ["one_device", "mesh_1x2", "mesh_1x2_sp", "mesh_1x4",
                              "mesh_1x4_sp"], "The layouts measured, each in a fresh process.")
flags.DEFINE_string("run_of", None, "(internal) measure one layout in this process.")
FLAGS = flags.FLAGS
REGION = "(norm1|attention|add1|norm2|down|add2)"


def _shape():
    if FLAGS.quick:
        return 16, 8, 1, 4
    return FLAGS.width, FLAGS.sequence, FLAGS.blocks, FLAGS.heads


def _model(keras):
    width, sequence, blocks, heads = _shape()
    keras.utils.set_random_seed(1)
    inputs = keras.Input((sequence, width))
    x = inputs
    for b in range(blocks):
        h = keras.layers.LayerNormalization(name=f"b{b}_norm1")(x)
        attended = keras.layers.MultiHeadAttention(heads, width // heads,
                                                   name=f"b{b}_attention")(h, h)
        x = keras.layers.Add(name=f"b{b}_add1")([x, attended])
        h = keras.layers.LayerNormalization(name=f"b{b}_norm2")(x)
        h = keras.layers.Dense(4 * width, activation="gelu", name=f"b{b}_up")(h)
        x = keras.layers.Add(name=f"b{b}_add2")([x, keras.layers.Dense(width,
                                                                       name=f"b{b}_down")(h)])
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled))
    model.compile(optimizer=keras.optimizers.Adam(0.001), loss="mse")
    return model


def _layout(keras, devices, model_axis: int, sequence: bool):
    mesh = keras.distribution.DeviceMesh((1, model_axis), ["batch", "model"],
                                         devices[:model_axis])
    rules = keras.distribution.LayoutMap(mesh)
    rules[r"b\d+_attention/(query|key|value)/kernel"] = (None, "model", None)
    rules[r"b\d+_attention/(query|key|value)/bias"] = ("model", None)
    rules[r"b\d+_attention/attention_output/kernel"] = ("model", None, None)
    rules[r"b\d+_up/kernel"] = (None, "model")
    rules[r"b\d+_down/kernel"] = ("model", None)
    if sequence:
        rules[rf"b\d+_{REGION}/output"] = ("batch", "model", None)
    return keras.distribution.ModelParallel(layout_map=rules, batch_dim_name="batch")


def measure_one(layout: str) -> dict:
    """One layout, in this process."""
    import tfdist  # pylint: disable=import-outside-toplevel

    devices = tfdist.strategies.configure_logical_cpus(4)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist.parallel import device_traffic  # pylint: disable=import-outside-toplevel
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    width, sequence, _, _ = _shape()
    model = _model(keras)
    model_axis = {"one_device": 1, "mesh_1x2": 2, "mesh_1x4": 4}[layout.removesuffix("_sp")]
    tfdist.attach(model, parallel=None if model_axis == 1 else _layout(
        keras, devices, model_axis, layout.endswith("_sp")))
    rows = FLAGS.batch_size
    x = np.random.default_rng(0).random((rows, sequence, width), "float32")
    y = x.mean(axis=(1, 2))[:, None]
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    steps = 2 if FLAGS.quick else FLAGS.steps
    model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)  # (traced, built)
    seconds = []
    for _ in range(1 if FLAGS.quick else FLAGS.rounds):
        start = time.perf_counter()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        seconds.append((time.perf_counter() - start) / steps)
    step = keras_fit.attachment_of(model).trainer()._steps.train  # pylint: disable=protected-access
    batch = tfdist.Batch(tf.constant(x), tf.constant(y)).to_structure()
    graph = tf.function(step).get_concrete_function(batch).graph
    kept = _kept_bytes_by_device(graph, tf)
    crossing = [c for c in device_traffic.crossings(graph, default_device="/cpu:0")
                if c.shape and c.bytes and c.shape[0] == rows
                and graph.get_tensor_by_name(c.tensor).op.type != "Placeholder"]
    first = tf.DeviceSpec.from_string(devices[0]).device_index or 0
    return {"layout": layout, "kept_mb_first": kept.get(first, 0) / 2**20,
            "kept_mb_most": max(kept.values()) / 2**20,
            "activation_mb": sum(c.bytes for c in crossing) / 2**20,
            "ms_per_step": 1000 * float(np.median(seconds))}


def _kept_bytes_by_device(graph, tf) -> dict:
    """Bytes of the forward pass' tensors (made before the tape's first
    gradient op) that the backward pass reads, so the step keeps them from
    one to the other, by the device that computed them (an identity's
    output counted as its input's buffer; each buffer once)."""
    from tfdist.parallel import device_traffic  # pylint: disable=import-outside-toplevel

    needed = device_traffic.needed_ops(graph)  # (TensorFlow prunes the rest)
    forward, backward = set(), []
    for op in graph.get_operations():  # (in the order they were made)
        if needed is not None and op.name not in needed:
            continue
        if backward or op.name.startswith("gradient_tape/"):
            backward.append(op)
        else:
            forward.add(op.name)

    def buffer(tensor):  # (through identities, to the tensor that owns the memory)
        while tensor.op.type in ("Identity", "IdentityN", "Reshape", "ExpandDims", "Squeeze"):
            tensor = tensor.op.inputs[tensor.value_index if tensor.op.type == "IdentityN" else 0]
        return tensor

    kept = {}
    for op in backward:
        for tensor in op.inputs:
            if tensor.op.name not in forward or not tensor.dtype.is_floating:
                continue
            owner = buffer(tensor)
            if owner.op.type in ("ReadVariableOp", "Const", "Placeholder") or \
                    not owner.shape.num_elements():
                continue
            kept[owner.name] = (owner.op.device, owner.shape.num_elements() * owner.dtype.size)
    by_device = {}
    for device, size in kept.values():
        index = (tf.DeviceSpec.from_string(device).device_index or 0) if device else 0
        by_device[index] = by_device.get(index, 0) + size
    return by_device


def main(argv) -> int:
    del argv  # every option is a flag
    if FLAGS.run_of:
        import json  # pylint: disable=import-outside-toplevel

        print(json.dumps(measure_one(FLAGS.run_of)))
        return 0
    rows = []
    for layout in FLAGS.layouts:
        command = [sys.executable, __file__, f"--run_of={layout}", f"--quick={FLAGS.quick}",
                   f"--width={FLAGS.width}", f"--sequence={FLAGS.sequence}",
                   f"--blocks={FLAGS.blocks}", f"--heads={FLAGS.heads}",
                   f"--batch_size={FLAGS.batch_size}", f"--steps={FLAGS.steps}",
                   f"--rounds={FLAGS.rounds}"]
        rows.append(measure.row_in_fresh_process(command))
        print(rows[-1], flush=True)
    one = next((r for r in rows if r["layout"] == "one_device"), None)
    lines = ["| layout | kept MB on the first device | most kept MB on a device | "
             "activation MB between devices | ms per step | vs one device |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['kept_mb_first']:.1f} | {r['kept_mb_most']:.1f} | "
              f"{r['activation_mb']:.1f} | {r['ms_per_step']:.1f} | "
              + (f"{r['ms_per_step'] / one['ms_per_step']:.2f}x |" if one else "- |")
              for r in rows]
    table = "\n".join(lines) + "\n"
    outputs.write_results(FLAGS.output_dir, "sequence_parallel_benchmark", {"rows": rows},
                          table)
    print(table)
    return 0


if __name__ == "__main__":
    app.run(main)
