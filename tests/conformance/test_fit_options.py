"""The conformance matrix, second half: the ways users feed and steer
``fit``, each written once as user code and run unchanged on plain Keras
on one device (the reference) and on ``tfdist.attach`` under a strategy.

Inputs (arrays, a ``PyDataset`` with worker threads and with worker
processes, a generator,
``.repeat()`` with ``steps_per_epoch``, ``class_weight`` with a dataset and
with a ``PyDataset``, a second ``fit`` with ``initial_epoch``), callbacks
(EarlyStopping with ``restore_best_weights``, ReduceLROnPlateau,
LearningRateScheduler, ModelCheckpoint, BackupAndRestore interrupted and
resumed) and a ``.keras`` save loaded in a process without tfdist. The
model is the embedding family (sparse gradients: the one that crashed on
partial batches), the data 107 rows in batches of 24 (an uneven last batch).
CI runs each on 3 replicas; ``--conformance=full`` on 1, 2, 3 and 4.
"""

import os
import pathlib
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import tfdist
from conformance import harness, zoo
from tests.support import strategy_columns

pytestmark = pytest.mark.conformance

CASE = zoo.BY_NAME["embedding_pooling"]
EXAMPLES, BATCH = harness.BATCH_SHAPES["partial"], harness.GLOBAL_BATCH
CLASS_WEIGHT = {0: 1.0, 1: 2.5, 2: 0.5}
REPLICAS = (1, 2, 3, 4)


def _arrays():
    return zoo._token_arrays(EXAMPLES)  # pylint: disable=protected-access


class TokenBatches(keras.utils.PyDataset):
    """The token arrays as a PyDataset: batch i is rows [24 i, 24 (i+1))."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = _arrays()

    def __len__(self):
        return -(-len(self.x) // BATCH)

    def __getitem__(self, index):
        rows = slice(index * BATCH, (index + 1) * BATCH)
        return self.x[rows], self.y[rows]


def _generator():
    x, y = _arrays()
    for _ in range(2):  # two epochs' worth
        for start in range(0, len(x), BATCH):
            yield x[start:start + BATCH], y[start:start + BATCH]


class StopAtStep(keras.callbacks.Callback):
    """Interrupts training after ``step`` batches (a preemption)."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise KeyboardInterrupt("preempted")


def _dataset():
    return CASE.dataset(EXAMPLES, BATCH)


def _fit_twice(model, tmp):
    model.fit(_dataset(), epochs=1, verbose=0)
    return model.fit(_dataset(), epochs=3, initial_epoch=1, verbose=0)


def _backup_and_restore(model, tmp):
    backup = keras.callbacks.BackupAndRestore(str(tmp / "backup"))
    try:
        model.fit(_dataset(), epochs=3, verbose=0, callbacks=[backup, StopAtStep(7)])
    except KeyboardInterrupt:
        pass
    return model.fit(_dataset(), epochs=3, verbose=0, callbacks=[backup])


def _model_checkpoint(model, tmp):
    path = tmp / "best.weights.h5"
    history = model.fit(_dataset(), epochs=3, verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(
        str(path), monitor="loss", save_best_only=True, save_weights_only=True)])
    model.load_weights(str(path))  # the saved file: what a user loads back
    return history


# Each: (name, user code run on the model, for tmp a per-run directory).
OPTIONS = {
    "arrays": lambda m, tmp: m.fit(*_arrays(), batch_size=BATCH, epochs=2, shuffle=False,
                                   verbose=0),
    "py_dataset_threads": lambda m, tmp: m.fit(
        TokenBatches(workers=2), epochs=2, shuffle=False, verbose=0),
    "generator": lambda m, tmp: m.fit(_generator(), steps_per_epoch=5, epochs=2, verbose=0),
    "repeat_steps_per_epoch": lambda m, tmp: m.fit(_dataset().repeat(), steps_per_epoch=3,
                                                   epochs=3, verbose=0),
    "class_weight_dataset": lambda m, tmp: m.fit(_dataset(), class_weight=CLASS_WEIGHT,
                                                 epochs=2, verbose=0),
    "class_weight_py_dataset": lambda m, tmp: m.fit(TokenBatches(), class_weight=CLASS_WEIGHT,
                                                    epochs=2, shuffle=False, verbose=0),
    "second_fit_initial_epoch": _fit_twice,
    "early_stopping_restore_best": lambda m, tmp: m.fit(
        _dataset(), epochs=6, verbose=0, callbacks=[keras.callbacks.EarlyStopping(
            monitor="loss", patience=1, min_delta=0.05, restore_best_weights=True)]),
    "reduce_lr_on_plateau": lambda m, tmp: m.fit(
        _dataset(), epochs=4, verbose=0, callbacks=[keras.callbacks.ReduceLROnPlateau(
            monitor="loss", patience=0, min_delta=0.05, factor=0.5)]),
    "learning_rate_scheduler": lambda m, tmp: m.fit(
        _dataset(), epochs=3, verbose=0,
        callbacks=[keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)]),
    "model_checkpoint": _model_checkpoint,
    "backup_and_restore_resumed": _backup_and_restore,
}


def _matrix():
    for option in OPTIONS:
        for replicas in REPLICAS:
            marks = [] if replicas == 3 else [pytest.mark.conformance_full]
            yield pytest.param(option, replicas, marks=marks, id=f"{option}-{replicas}")


def _strategy(replicas):
    return strategy_columns.in_process(replicas)


def _run(option, model, tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    history = OPTIONS[option](model, tmp)
    return harness.Result(model.get_weights(), dict(history.history),
                          model.evaluate(_dataset(), verbose=0, return_dict=True),
                          [np.asarray(model.predict(_arrays()[0], batch_size=BATCH, verbose=0))])


@pytest.mark.parametrize("option,replicas", list(_matrix()))
def test_user_code_equals_one_device(tmp_path, option, replicas):
    expected = CASE.build()
    CASE.compile(expected)
    initial = expected.get_weights()
    reference = _run(option, expected, tmp_path / "keras")
    strategy = _strategy(replicas)
    with strategy.scope():
        model = CASE.build()
        CASE.compile(model)
    model.set_weights(initial)
    tfdist.attach(model, strategy)
    result = _run(option, model, tmp_path / "tfdist")
    harness.assert_matches(reference, result, 1e-5)


def test_py_dataset_with_worker_processes_equals_one_device():
    """``workers=2, use_multiprocessing=True``, in a fresh process
    (`py_dataset_processes.py` says why). Its exit once hung: the forked
    pool workers inherited tfdist's SIGTERM handler and swallowed the
    SIGTERM with which ``multiprocessing`` ends them
    (`tests/cluster/test_stop_signals.py`). The program and its workers are
    one process group, ended by pid whatever happens."""
    program = subprocess.Popen(
        [sys.executable, str(pathlib.Path(__file__).with_name("py_dataset_processes.py"))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = program.communicate(timeout=300)
    finally:
        _end_group(program)
    assert program.returncode == 0, output[-3000:]
    assert "largest weight difference" in output


def _end_group(program):
    try:
        os.killpg(program.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    program.wait(30)


LOAD_WITHOUT_TFDIST = """
import json, sys
import keras, numpy as np
assert "tfdist" not in sys.modules
model = keras.models.load_model(sys.argv[1])
x, y = np.load(sys.argv[2])["x"], np.load(sys.argv[2])["y"]
predictions = model.predict(x, batch_size=24, verbose=0)
model.fit(x, y, batch_size=24, epochs=1, shuffle=False, verbose=0)
np.savez(sys.argv[3], predictions=predictions, *model.get_weights())
print("tfdist" in sys.modules)
"""


def test_keras_save_loads_without_tfdist_and_training_continues(tmp_path):
    """A ``.keras`` file saved after tfdist training, loaded in a process
    that never imports tfdist: same predictions, and one more epoch there
    equals one more epoch of the one-device reference."""
    x, y = _arrays()
    expected = CASE.build()
    CASE.compile(expected)
    initial = expected.get_weights()
    expected.fit(_dataset(), epochs=2, verbose=0)
    strategy = _strategy(3)
    with strategy.scope():
        model = CASE.build()
        CASE.compile(model)
    model.set_weights(initial)
    tfdist.attach(model, strategy).fit(_dataset(), epochs=2, verbose=0)
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "data.npz", x=x, y=y)
    predictions_after_fit = expected.predict(x, batch_size=BATCH, verbose=0)
    expected.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

    script = tmp_path / "load.py"
    script.write_text(LOAD_WITHOUT_TFDIST)
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model.keras"), str(tmp_path / "data.npz"),
         str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300,
        cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == "False"  # tfdist never imported
    with np.load(tmp_path / "out.npz") as loaded:
        np.testing.assert_allclose(loaded["predictions"], predictions_after_fit, atol=1e-5, rtol=0)
        for index, want in enumerate(expected.get_weights()):
            np.testing.assert_allclose(loaded[f"arr_{index}"], want, atol=1e-5, rtol=0,
                                       err_msg=f"weight {index}")
