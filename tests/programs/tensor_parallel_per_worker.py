"""A worker program for a data x model mesh across processes: 2
MultiWorkerMirroredStrategy workers (one replica each) are the mesh's
data axis, and each worker splits tests/parallel/test_tensor_parallel.py's
MLP (a Dense column-then-row pair) over its own 2 logical CPUs, the
mesh's model axis, from a Keras ``LayoutMap``; each shard's gradient is
all-reduced over the workers once per step. ``--stages=2``: data x
pipeline x model, each worker's 4 logical CPUs 2 pipeline stages (cut
after d1: the column layer on stage 0, the row layer on stage 1) of 2
model devices each. ``--fully_sharded``: data x model x fully sharded,
each shard (and each replicated weight) sliced over the 2 workers'
replicas (`tfdist.communication.FullySharded`). ``--sequence``: instead
of the MLP, tests/parallel/test_sequence_parallel.py's transformer block,
its attention split by heads and its replicated region by sequence over
each worker's 2 CPUs. ``--checkpoint_dir``:
checkpoints for fault tests; ``--refusals``: first tries meshes it must
refuse, and writes each error. ``--count_collectives``: the collectives of
one traced training step too.

Writes ``<output_dir>/<task>.json``: the history, evaluation, predictions,
final weights and the devices of each shard's copy.
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import keras  # noqa: E402
import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--refusals", action="store_true")
    parser.add_argument("--stages", type=int, default=1, choices=(1, 2))
    parser.add_argument("--fully_sharded", action="store_true")
    parser.add_argument("--sequence", action="store_true")
    parser.add_argument("--async_checkpoint", action="store_true",
                        help="background saves; reports the most bytes they held on the host")
    parser.add_argument("--step_delay", type=float, default=0.0,
                        help="seconds to sleep after each step (fault tests)")
    parser.add_argument("--count_collectives", action="store_true",
                        help="also writes the collectives of one traced training step")
    args = parser.parse_args()

    # (the worker's replica, then its model device; with 2 stages, stage 1's two)
    tfdist.strategies.configure_logical_cpus(2 * args.stages)
    strategy = tfdist.make_strategy("multi_worker_mirrored", num_replicas=1)
    from tests.parallel import test_tensor_parallel as in_process  # pylint: disable=import-outside-toplevel
    from tests.support import step_progress  # pylint: disable=import-outside-toplevel
    from tfdist.parallel import tensor_parallel  # pylint: disable=import-outside-toplevel

    devices = tfdist.parallel.mesh_devices(strategy, model_devices=2 * args.stages)
    refusals = _refusals(strategy, in_process) if args.refusals else {}
    x, y = in_process._data()  # pylint: disable=protected-access
    batch_size = in_process.BATCH
    with strategy.scope():
        model = in_process._compiled(in_process._mlp(), args.optimizer)  # pylint: disable=protected-access
    if args.sequence:
        from tests.parallel import test_sequence_parallel as sequence  # pylint: disable=import-outside-toplevel

        with strategy.scope():
            model = sequence._model()  # pylint: disable=protected-access
        parallel = sequence.layers._layout(2, 2, devices, sequence.RULES)  # pylint: disable=protected-access
        x, y = sequence.layers._data()  # pylint: disable=protected-access
        batch_size = sequence.BATCH
    elif args.stages == 1:
        parallel = in_process._layout(2, 2, devices, in_process.MEGATRON)  # pylint: disable=protected-access
    else:
        mesh = keras.distribution.DeviceMesh((2, 2, 2), ["batch", "pipeline", "model"], devices)
        layout_map = keras.distribution.LayoutMap(mesh)
        for key, axes in in_process.MEGATRON.items():
            layout_map[key] = axes
        parallel = [tfdist.parallel.Pipeline(cuts=["d1"], micro_batches=3),
                    keras.distribution.ModelParallel(layout_map=layout_map,
                                                     batch_dim_name="batch")]
    model = tfdist.attach(
        model, strategy, parallel=parallel,
        communication=tfdist.communication.FullySharded() if args.fully_sharded else None,
        checkpointing=tfdist.CheckpointOptions(args.checkpoint_dir,
                                               every_steps=args.checkpoint_every_steps,
                                               async_write=args.async_checkpoint))
    host_bytes = {"most": 0}
    history = model.fit(x, y, batch_size=batch_size, epochs=args.epochs, shuffle=False,
                        verbose=0, callbacks=[step_progress.callback(model, args.step_delay),
                                              _background_host_bytes(model, host_bytes)]
                        ).history
    shards, slices = {}, {}
    for weight in model.weights:
        for index, shard in enumerate(tensor_parallel.shards_of(weight) or []):
            shards[f"{weight.path}[{index}]"] = [copy.device for copy in shard.value.values]
            slices[f"{weight.path}[{index}]"] = [
                int(copy.shape.num_elements()) for copy in shard.value.values]
    result = {
        "history": history,
        "evaluation": model.evaluate(x, y, batch_size=batch_size, verbose=0,
                                     return_dict=True),
        "predictions": model.predict(x, batch_size=batch_size, verbose=0).tolist(),
        "weights": [w.tolist() for w in model.get_weights()],
        "mesh": devices,
        "shards": shards,
        "slice_elements": slices,
        "background_host_bytes": host_bytes["most"],
        "refusals": refusals,
        "step_variables": len(tfdist.parallel.tensor_parallel.trainable_variables(
            model.trainable_variables)),
        "collectives": _step_collectives(model, strategy, x, y, batch_size)
        if args.count_collectives else None,
    }
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{tfdist.cluster.task_name()}.json").write_text(json.dumps(result))


def _step_collectives(model, strategy, x, y, rows: int) -> dict:
    """The collective ops of this worker's replica in one training step,
    traced (not run) on ``rows`` rows: ``{op type: [elements of its input]}``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    steps = keras_fit.attachment_of(model).trainer()._steps  # pylint: disable=protected-access
    batch = strategy.experimental_distribute_values_from_function(
        lambda _: tfdist.Batch(tf.constant(x[:rows]), tf.constant(y[:rows])).to_structure())
    graph = tf.function(lambda structure: strategy.run(steps.train, args=(structure,))
                        ).get_concrete_function(batch).graph
    found = {}
    for op in graph.get_operations():
        if op.type.startswith("Collective"):
            found.setdefault(op.type, []).append(op.inputs[0].shape.num_elements())
    return found


def _background_host_bytes(model, noted: dict):
    """A callback keeping in ``noted["most"]`` the most bytes this worker's
    background saves held on its host, seen after every step."""
    from tfdist.training import keras_fit  # pylint: disable=import-outside-toplevel

    def seen(batch, logs):
        del batch, logs
        checkpoint = keras_fit.attachment_of(model).trainer()._checkpoint  # pylint: disable=protected-access
        if checkpoint is not None:
            noted["most"] = max(noted["most"], checkpoint.background_host_bytes())

    return keras.callbacks.LambdaCallback(on_train_batch_end=seen)


def _refusals(strategy, in_process) -> dict:
    """Each mesh this cluster cannot run, and the error its first fit raised."""
    task = "/job:worker/task:{}/device:CPU:{}".format
    meshes = {
        "unnamed tasks": ["cpu:0", "cpu:1", "cpu:2", "cpu:3"],
        "a row over two workers": [task(0, 0), task(1, 0), task(0, 1), task(1, 1)],
        "every row on worker 0": [task(0, 0), task(0, 1), task(0, 2), task(0, 3)],
    }
    errors = {}
    for name, devices in meshes.items():
        with strategy.scope():
            model = in_process._compiled(in_process._mlp(), "adam")  # pylint: disable=protected-access
        try:
            tfdist.attach(model, strategy, parallel=in_process._layout(  # pylint: disable=protected-access
                2, 2, devices, in_process.MEGATRON))
            x, y = in_process._data()  # pylint: disable=protected-access
            model.fit(x[:8], y[:8], batch_size=8, verbose=0)  # (the split is made here)
            errors[name] = None
        except tfdist.errors.ConfigurationError as error:
            errors[name] = str(error)
    return errors


if __name__ == "__main__":
    main()
