"""Progress lines and TensorBoard summaries."""

import glob
import re

import tensorflow as tf

import tfdist
from tests import reference as ref
from tfdist.progress import format_line

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
    trainer = tfdist.Trainer(model, strategy, log_dir=str(tmp_path), log_every_steps=2)
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
    tfdist.Trainer(model, strategy, log_every_steps=1).fit(
        ref.global_batches(40, 16), epochs=1, verbose=0
    )
    assert "train |" not in capsys.readouterr().out
