"""A worker program for multi-process tests: trains tests/support/reference.py's MLP.

Run under tfdist-run (or with TF_CONFIG by hand). Writes
``<output_dir>/<task>.json`` with the history and final weights, which the
tests compare with single-device Keras `fit` on the same data.
"""

import argparse
import json
import os
import pathlib
import signal
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def _broken_host(args):
    """For elastic-shrink tests: a callback that SIGKILLs this worker at
    ``--broken_at_step`` the first time (leaving a marker), or None; once the
    marker exists, this worker exits before joining, as a dead host would."""
    if args.broken_worker is None:
        return None
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    marker = pathlib.Path(args.output_dir) / f"broken-worker-{args.broken_worker}"
    workers = config.get("cluster", {}).get("worker", [])
    if config.get("task", {}).get("index") != args.broken_worker or len(workers) <= args.broken_worker:
        return None
    if marker.exists():
        print(f"worker-{args.broken_worker}: host is broken, exiting before joining", flush=True)
        sys.exit(3)
    import keras  # pylint: disable=import-outside-toplevel

    class KillAtStep(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen >= args.broken_at_step:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("killed")
                os.kill(os.getpid(), signal.SIGKILL)

    return KillAtStep()


def _endless_slow(dataset, seconds: float):
    """``dataset`` repeated, each batch ``seconds`` late."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def late(*batch):
        slept = tf.py_function(lambda: time.sleep(seconds) or 0.0, [], tf.float32)
        with tf.control_dependencies([slept]):
            return tf.nest.map_structure(tf.identity, batch)

    return dataset.repeat().map(late)


def _write(args, results):
    task = tfdist.cluster.task_name()
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"{task}.json"), "w", encoding="utf-8") as out:
        json.dump(results, out)


def _note_background_host_bytes(trainer, noted: dict):
    """A Keras callback keeping in ``noted["most"]`` the most bytes this
    worker's background saves held on its host, seen after every batch."""
    import keras  # pylint: disable=import-outside-toplevel

    checkpoint = trainer._checkpoint  # pylint: disable=protected-access
    noted["most"] = 0

    def seen(batch, logs):
        del batch, logs
        if checkpoint is not None:
            noted["most"] = max(noted["most"], checkpoint.background_host_bytes())

    return keras.callbacks.LambdaCallback(on_train_batch_end=seen)


def _keras_fit(args, model, strategy, ref):
    """The unchanged Keras calls, after tfdist.attach."""
    import keras  # pylint: disable=import-outside-toplevel

    batch_logs = []

    class BatchLogs(keras.callbacks.Callback):  # on the chief only: workers still agree
        def on_train_batch_end(self, batch, logs=None):
            batch_logs.append([batch, logs])

    x, y, _ = ref.classification_arrays(args.examples)
    tfdist.attach(model, strategy)
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
                        validation_split=0.2, shuffle=False, verbose=0,
                        callbacks=[BatchLogs()] if tfdist.cluster.is_chief() else [])
    results = {
        "history": history.history,
        "batch_logs": batch_logs,
        "evaluate": model.evaluate(x, y, batch_size=args.batch_size, verbose=0),
        "predict": model.predict(x, batch_size=args.batch_size, verbose=0).tolist(),
        "weights": [w.tolist() for w in model.get_weights()],
    }
    # After fit, evaluate and predict: the *_on_batch methods.
    results["on_batch"] = [model.train_on_batch(x[:2], y[:2]), model.test_on_batch(x[:5], y[:5]),
                           model.predict_on_batch(x[:3]).tolist()]
    # Then Keras' gradient accumulation (2 micro-batches per update), same
    # cluster; verbose=1: the chief's Keras progress bar has a batch hook and
    # the worker has none, so one runs executions one by one and the other
    # in stretches (`tfdist.loops.runners.base`): they must still agree.
    with strategy.scope():
        accumulating = ref.compile_model(ref.build_mlp(), "adam")
        accumulating.optimizer.gradient_accumulation_steps = 2
    tfdist.attach(accumulating, strategy)
    history = accumulating.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
                               shuffle=False, verbose=1)
    results["accumulated"] = {
        "history": history.history,
        "weights": [w.tolist() for w in accumulating.get_weights()],
    }
    _write(args, results)


def _accumulate_fully_sharded(args, strategy, ref):
    """``gradient_accumulation_steps=2`` under ``FullySharded()``, through
    tfdist.attach and model.fit: its weights and history."""
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
        model.optimizer.gradient_accumulation_steps = 2
    tfdist.attach(model, strategy, communication=tfdist.communication.FullySharded())
    x, y, _ = ref.classification_arrays(args.examples)
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False,
                        verbose=0)
    _write(args, {"history": history.history,
                  "weights": [w.tolist() for w in model.get_weights()]})


def _own_step(args, strategy, ref):
    """A model's own step (keras.io's patterns), after tfdist.attach."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tests.support import models  # pylint: disable=import-outside-toplevel

    cls = {"guide_train_step": models.GuideTrainStep,
           "penalty_loss": models.PenaltyLoss,
           "returns_batch_values": models.ReturnsBatchValues}[args.own_step]
    with strategy.scope():
        model = models.compiled_model(cls)
    tfdist.attach(model, strategy)
    x, y, _ = ref.classification_arrays(args.examples)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size)
    history = model.fit(dataset, epochs=args.epochs, verbose=0)
    _write(args, {"history": history.history,
                  "weights": [w.tolist() for w in model.get_weights()]})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--replicas_per_worker", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=70)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--checkpoint_every_steps", type=int, default=None)
    parser.add_argument("--step_delay", type=float, default=0.0,
                        help="seconds slept in a batch-end callback (executions one by one)")
    parser.add_argument("--endless_slow_data", type=float, default=0.0,
                        help="seconds slept per batch in the input pipeline, which repeats "
                             "(steps_per_epoch: a pass): slow steps with no batch hook, so "
                             "executions run in stretches on endless data")
    parser.add_argument("--log_every_steps", type=int, default=2)
    parser.add_argument("--timeout_seconds", type=float, default=0.0,
                        help="per-collective timeout; 0: none (tfdist's default)")
    parser.add_argument("--broken_worker", type=int, default=None,
                        help="this worker index of the first cluster size is on a "
                             "broken host: killed at --broken_at_step, then it dies "
                             "before joining every time it is started again")
    parser.add_argument("--broken_at_step", type=int, default=3)
    parser.add_argument("--validation_examples", type=int, default=0,
                        help="also validate on this many examples each epoch (0: no)")
    parser.add_argument("--shuffle_seed", type=int, default=None,
                        help="train on reference.shuffled_batches with this seed "
                             "(reshuffled every epoch) instead of the fixed order")
    parser.add_argument("--mixed_float16", action="store_true",
                        help="build the model under the mixed_float16 policy (a "
                             "LossScaleOptimizer) and make row 15's gradient overflow")
    parser.add_argument("--own_step", choices=("guide_train_step", "penalty_loss", "returns_batch_values"),
                        default=None,
                        help="train tests/support/models.py's model with its own "
                             "train_step or compute_loss (tfdist.attach + fit on "
                             "(x, y) batches)")
    parser.add_argument("--data_service", default=None,
                        help="DataOptions(data_service=...): 'auto' reads tfdist-run's "
                             "TFDIST_DATA_SERVICE")
    parser.add_argument("--async_checkpoint", action="store_true",
                        help="CheckpointOptions(async_write=True): saves written in the background")
    parser.add_argument("--keras_fit", action="store_true",
                        help="train with tfdist.attach + model.fit on arrays, with "
                             "validation_split=0.2, and also predict; then fit a "
                             "second model with gradient_accumulation_steps=2")
    parser.add_argument("--local_sgd", type=int, default=None,
                        help="Trainer(communication=LocalSGD(every_steps=N, outer_optimizer="
                             "tests/communication/test_local_sgd.py's)) on its SGD-with-momentum model")
    parser.add_argument("--sharded_state", action="store_true",
                        help="Trainer(communication=ShardedOptimizerState()): Adam's state "
                             "in one slice per replica")
    parser.add_argument("--fully_sharded", action="store_true",
                        help="Trainer(communication=FullySharded()): the weights and Adam's "
                             "state in one slice per replica")
    parser.add_argument("--accumulate_fully_sharded", action="store_true",
                        help="attach + fit with gradient_accumulation_steps=2 and "
                             "FullySharded() (only that)")
    parser.add_argument("--metric_made_outside_scope", action="store_true",
                        help="compile with a metric object made before strategy.scope() "
                             "(refused across workers)")
    args = parser.parse_args()
    broken = _broken_host(args)

    strategy = tfdist.make_strategy(
        "multi_worker_mirrored", num_replicas=args.replicas_per_worker,
        timeout_seconds=args.timeout_seconds or None,
    )
    import keras  # pylint: disable=import-outside-toplevel

    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(args.step_delay)

    communication = None
    made_outside = keras.metrics.SparseTopKCategoricalAccuracy(2, name="top2")
    with strategy.scope():
        if args.local_sgd:
            from tests.communication import test_local_sgd as local  # pylint: disable=import-outside-toplevel

            model = local._model()  # pylint: disable=protected-access
            communication = tfdist.communication.LocalSGD(
                args.local_sgd, outer_optimizer=local._outer())  # pylint: disable=protected-access
        else:
            model = ref.compile_model(ref.build_mlp(mixed_float16=args.mixed_float16), "adam")
            if args.sharded_state:
                communication = tfdist.communication.ShardedOptimizerState()
            if args.fully_sharded:
                communication = tfdist.communication.FullySharded()
            if args.metric_made_outside_scope:
                model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                              metrics=[made_outside])
    if args.keras_fit:
        _keras_fit(args, model, strategy, ref)
        return
    if args.accumulate_fully_sharded:
        _accumulate_fully_sharded(args, strategy, ref)
        return
    if args.own_step:
        _own_step(args, strategy, ref)
        return
    trainer = tfdist.Trainer(model, strategy, communication=communication,
        checkpointing=tfdist.CheckpointOptions(
            args.checkpoint_dir, every_steps=args.checkpoint_every_steps,
            async_write=args.async_checkpoint),
        input_pipeline=tfdist.DataOptions(data_service=args.data_service),
        reporting=tfdist.ReportingOptions(log_every_steps=args.log_every_steps))
    host_bytes = {}
    overflow_row = 15 if args.mixed_float16 else None
    dataset = (ref.global_batches(args.examples, args.batch_size, overflow_row=overflow_row)
               if args.shuffle_seed is None
               else ref.shuffled_batches(args.examples, args.batch_size, args.shuffle_seed))
    history = trainer.fit(
        _endless_slow(dataset, args.endless_slow_data) if args.endless_slow_data else dataset,
        steps_per_epoch=-(-args.examples // args.batch_size) if args.endless_slow_data else None,
        epochs=args.epochs, verbose=1,
        callbacks=[c for c in (Slow() if args.step_delay else None, broken,
                               _note_background_host_bytes(trainer, host_bytes)) if c],
        validation_data=(ref.global_batches(args.validation_examples, args.batch_size)
                         if args.validation_examples else None),
    )
    _write(args, {
        "history": history.history,
        "evaluate": trainer.evaluate(dataset),
        "weights": [w.tolist() for w in model.get_weights()],
        "optimizer_state_shapes": [list(v.shape) for v in model.optimizer.variables],
        # What this worker's first replica keeps of each weight (a slice, when fully sharded).
        "weight_slice_shapes": [list(strategy.experimental_local_results(w.value)[0].shape)
                                for w in model.trainable_weights],
        "background_host_bytes": host_bytes["most"],
    })


if __name__ == "__main__":
    main()
