"""Keras callbacks that write files, on 2 workers under ``tfdist-run``
(tests/programs/callback_files.py): ModelCheckpoint, TensorBoard,
CSVLogger and BackupAndRestore all point at one shared directory, as a
user writes them. The chief alone writes there; the other worker writes to
a private temporary directory that is gone afterwards; BackupAndRestore
resumes an interrupted job on both workers, and the result equals one
device.
"""

import csv
import json
import sys

import keras
import pytest

from tests.support import reference as ref
from tests.support.launcher_harness import LauncherRun

PROGRAM = [sys.executable, "tests/programs/callback_files.py"]
EPOCHS, STOP_AFTER = 4, 2


def _run(tmp_path, run, *extra):
    command = PROGRAM + [f"--shared_dir={tmp_path / 'shared'}",
                         f"--output_dir={tmp_path / 'out'}", f"--run={run}",
                         f"--epochs={EPOCHS}", *extra]
    with LauncherRun(["--num_workers=2"], command) as launched:
        return launched.wait(timeout=300), launched.output


def _result(tmp_path, task, run):
    return json.loads((tmp_path / "out" / f"{task}-run{run}.json").read_text())


@pytest.fixture(scope="module")
def one_device():
    model, history = ref.keras_fit(ref.global_batches(70, 16), EPOCHS, "adam")
    return model.get_weights(), history


def test_the_chief_writes_each_file_once_and_an_interrupted_job_resumes(
        tmp_path, monkeypatch, one_device):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the other worker's files go
    code, output = _run(tmp_path, 1, f"--stop_after_epoch={STOP_AFTER}")
    assert code != 0 and f"stopped after epoch {STOP_AFTER}" in output, output[-3000:]
    code, output = _run(tmp_path, 2)
    assert code == 0, output[-4000:]

    expected_weights, expected_history = one_device
    for task in ("worker-0", "worker-1"):
        assert _result(tmp_path, task, 1)["epochs"] == list(range(STOP_AFTER))
        # BackupAndRestore: both workers resumed after the saved epoch.
        resumed = _result(tmp_path, task, 2)
        assert resumed["epochs"] == list(range(STOP_AFTER, EPOCHS))
        ref.assert_weight_lists_close(expected_weights, resumed["weights"])

    shared = tmp_path / "shared"
    # ModelCheckpoint: one file per epoch, and the last one loads to the result.
    assert sorted(p.name for p in shared.glob("model-*.keras")) == [
        f"model-{epoch}.keras" for epoch in range(1, EPOCHS + 1)]
    loaded = keras.models.load_model(shared / f"model-{EPOCHS}.keras")
    ref.assert_weight_lists_close(expected_weights, loaded.get_weights())
    # TensorBoard: events of both jobs, from the chief's processes only.
    chief_pids = {str(_result(tmp_path, "worker-0", run)["pid"]) for run in (1, 2)}
    events = sorted((shared / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert {p.name.split(".")[-3] for p in events} == chief_pids, [p.name for p in events]
    # CSVLogger: one header, one row per epoch, the one-device losses.
    with open(shared / "history.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["epoch"]) for row in rows] == list(range(EPOCHS))
    ref.assert_logs_close({"loss": expected_history["loss"]},
                          {"loss": [float(row["loss"]) for row in rows]})
    # BackupAndRestore's files are the chief's; the other worker left nothing.
    assert sorted(p.name for p in (shared / "backup").iterdir()) == [
        "latest.weights.h5", "training_metadata.json"]
    assert list(scratch.iterdir()) == []
