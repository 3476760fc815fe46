"""A worker program for tests/training/test_callback_files.py: the reference
MLP through ``tfdist.attach`` + Keras ``fit`` with the Keras callbacks that
write files, all to one shared directory, as a multi-worker user writes
them: ModelCheckpoint, TensorBoard, CSVLogger and BackupAndRestore.

``--stop_after_epoch=K`` raises after epoch K's callbacks (BackupAndRestore
has saved): the job fails, and the next run resumes. Each run writes
``<output_dir>/<task>-run<N>.json``: pid, epochs run, weights.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--stop_after_epoch", type=int, default=None)
    args = parser.parse_args()

    import keras  # pylint: disable=import-outside-toplevel

    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    class StopAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if args.stop_after_epoch is not None and epoch + 1 == args.stop_after_epoch:
                raise RuntimeError(f"stopped after epoch {epoch + 1}, as the test asked")

    class EpochsRun(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)

    shared = pathlib.Path(args.shared_dir)
    strategy = tfdist.make_strategy("multi_worker_mirrored")
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.attach(model, strategy)
    epochs_run = EpochsRun()
    callbacks = [
        keras.callbacks.BackupAndRestore(str(shared / "backup"), delete_checkpoint=False),
        keras.callbacks.ModelCheckpoint(str(shared / "model-{epoch}.keras")),
        keras.callbacks.TensorBoard(str(shared / "tensorboard")),
        keras.callbacks.CSVLogger(str(shared / "history.csv"), append=True),
        epochs_run,
        StopAfterEpoch(),
    ]
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    result = {"pid": os.getpid(), "epochs": epochs_run.epochs}
    try:
        model.fit(ref.global_batches(70, 16), epochs=args.epochs, verbose=0, callbacks=callbacks)
    finally:
        result["weights"] = [w.tolist() for w in model.get_weights()]
        (output / f"{tfdist.cluster.task_name()}-run{args.run}.json").write_text(
            json.dumps(result))


if __name__ == "__main__":
    main()
