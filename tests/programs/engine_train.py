"""The training function engine tests hand to Spark and Ray workers.

It trains tests/support/reference.py's MLP with ``tfdist.Trainer`` under
MultiWorkerMirroredStrategy, the cluster read from the ``TF_CONFIG`` the
engine set, and returns what the tests compare with single-device Keras.
Imported by reference on the workers, so ``tests`` must be importable there
(the tests put the repository on ``PYTHONPATH``).
"""

import os

EXAMPLES, BATCH, EPOCHS = 70, 16, 3


def train_reference_mlp(epochs: int = EPOCHS, checkpoint_dir=None, callbacks=(),
                        initial_weights_from=None) -> dict:
    """Trains on the reference's global batches; returns this task's name,
    pid, history and weights (lists, so any pickler can carry them)."""
    import tfdist
    from tests.support import reference as ref

    strategy = tfdist.make_strategy("multi_worker_mirrored")
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy,
        checkpointing=tfdist.CheckpointOptions(checkpoint_dir),
        reporting=tfdist.ReportingOptions(log_every_steps=2))
    history = trainer.fit(ref.global_batches(EXAMPLES, BATCH), epochs=epochs, verbose=0,
                          callbacks=list(callbacks))
    return {
        "task": tfdist.cluster.task_name(),
        "pid": os.getpid(),
        "history": history.history,
        "weights": [w.tolist() for w in model.get_weights()],
    }


def ray_train_loop(config: dict) -> None:
    """Ray Train's per-worker function: `train_reference_mlp` with tfdist's
    Ray checkpoint directory and report callback; writes
    ``<output_dir>/<task>.json``. With ``kill_rank``, that worker SIGKILLs
    itself at batch 2 of epoch 2 the first time (a marker file remembers)."""
    import json
    import pathlib
    import signal

    import keras
    import ray.train

    import tfdist.integrations.ray

    output_dir = pathlib.Path(config["output_dir"])
    output_dir.mkdir(parents=True, exist_ok=True)
    marker = output_dir / "killed-once"

    class KillOnce(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 1 and batch == 2 and not marker.exists():
                # Once Ray holds epoch 1's checkpoint (its controller collects
                # reports asynchronously), so the restart resumes from it.
                ray.train.get_all_reported_checkpoints(
                    consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED,
                    timeout_s=60)
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)

    resumed_from = ray.train.get_checkpoint()
    directory = tfdist.integrations.ray.checkpoint_dir()
    callbacks = [tfdist.integrations.ray.ReportToRay(directory)]
    if config.get("kill_rank") == tfdist.integrations.ray.world_rank():
        callbacks.insert(0, KillOnce())
    result = train_reference_mlp(checkpoint_dir=directory, callbacks=callbacks)
    result["resumed_from"] = resumed_from.path if resumed_from else None
    (output_dir / f"{result['task']}.json").write_text(json.dumps(result))
