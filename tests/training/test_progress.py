"""Progress lines and TensorBoard summaries."""

import glob
import re
import subprocess
import sys

import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist import versions
from tfdist.training.progress import format_line

LINE = re.compile(
    r"^train \| epoch \d+ \| step \d+/(\d+|\?) \| loss \d+\.\d{4}( \| \w+ \d+\.\d{4})*( \| \d+ ex/s)?$"
)


def test_format_line_shape():
    line = format_line("train", 2, 120, 400, {"loss": 0.31, "accuracy": 0.91}, 850.2)
    assert line == "train | epoch 2 | step 120/400 | loss 0.3100 | accuracy 0.9100 | 850 ex/s"


def _tags(directory):
    tags = {}
    for path in glob.glob(f"{directory}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


def test_fit_logs_every_n_steps_and_writes_summaries(make_strategy, tmp_path, capsys):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy,
        reporting=tfdist.ReportingOptions(log_dir=str(tmp_path), log_every_steps=2))
    history = trainer.fit(
        ref.global_batches(70, 16), epochs=2, verbose=1,
        validation_data=ref.global_batches(30, 16),
    )

    lines = capsys.readouterr().out.splitlines()
    train_lines = [l for l in lines if l.startswith("train |")]
    assert all(LINE.match(l) for l in train_lines), train_lines
    # 5 steps per epoch: log points at steps 2 and 4, then the epoch line.
    assert [l.split(" | ")[2] for l in train_lines[:3]] == ["step 2/5", "step 4/5", "step 5/5"]
    assert any(l.startswith("eval | epoch 1 | loss") for l in lines)

    train_tags = _tags(tmp_path / "train")
    assert train_tags["epoch_loss"] == [0, 1]
    assert train_tags["batch_loss"] == [2, 4, 7, 9]
    assert _tags(tmp_path / "validation")["epoch_accuracy"] == [0, 1]
    assert history.history["val_loss"]


def test_verbose_zero_prints_nothing(make_strategy, capsys):
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.Trainer(model, strategy, reporting=tfdist.ReportingOptions(log_every_steps=1)).fit(
        ref.global_batches(40, 16), epochs=1, verbose=0
    )
    assert "train |" not in capsys.readouterr().out


_SUMMARY_MEMORY_PROGRAM = """
import sys
import tensorflow as tf
from tfdist.training.progress import ProgressReporter

def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS")) / 1024

reporter = ProgressReporter(verbose=0, log_dir=sys.argv[1])
def log_points(first, count):
    for step in range(first, first + count):
        reporter.log_point(epoch=0, step_in_epoch=step, total_steps=None, global_step=step,
                           values={"loss": 1.0 / (step + 1), "accuracy": step / 1e6},
                           examples_seen=float(step))
def python_scalars(first, count):  # what the reporter used to hand TensorFlow
    for step in range(first, first + count):
        tf.constant(step, tf.int64), tf.constant(1.0 / (step + 1)), tf.constant(step / 1e6)
log_points(0, 500)
before = rss_mb()
log_points(500, 6000)
after_reporter = rss_mb()
python_scalars(10_000, 6000)
print(after_reporter - before, rss_mb() - after_reporter)
"""


def test_summaries_at_log_points_do_not_grow_memory(tmp_path):
    """A log point's summary step and values are new numbers every time;
    TensorFlow keeps a cached tensor per distinct Python scalar it is
    handed, so they go to TensorFlow as numpy scalars (`tfdist._internal.host_values`).
    6,000 log points: the reporter's growth against the same numbers handed
    over as Python scalars (the control, which must grow before TensorFlow
    2.22; 2.22 no longer keeps those tensors, measured: 0.35 MB)."""
    done = subprocess.run([sys.executable, "-c", _SUMMARY_MEMORY_PROGRAM, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    reporter_mb, python_scalars_mb = map(float, done.stdout.split())
    if versions.minor_tuple(tf.__version__) < (2, 22):
        assert python_scalars_mb > 5.0  # the control: ~0.6 KB per distinct scalar, 18,000 of them
    assert reporter_mb < 1.5, (reporter_mb, python_scalars_mb)
