"""The embedded default dataset and the TFDS loader (no network)."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

import tfdist
from tests.support.program_loader import load_program
from tfdist.data.datasets import load_supervised, synthetic_patterns


def test_generation_is_deterministic_and_covers_all_classes():
    first = list(synthetic_patterns.generate_examples(200, seed=1))
    second = list(synthetic_patterns.generate_examples(200, seed=1))
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, second))
    assert {label for _, label in first} == set(range(10))
    assert first[0][0].shape == (16, 16, 1) and first[0][0].dtype == np.uint8


def test_builder_writes_sharded_files_locally(tmp_path):
    train = load_supervised("synthetic_patterns", "train", data_dir=str(tmp_path))
    test = load_supervised("synthetic_patterns", "test", data_dir=str(tmp_path))
    assert int(train.cardinality()) == 10_000 and int(test.cardinality()) == 2_000
    shards = list((tmp_path / "synthetic_patterns" / "1.0.0").glob("*-train.tfrecord-*"))
    assert len(shards) == 4
    image, label = next(iter(train))
    assert image.shape == (16, 16, 1) and 0 <= int(label) < 10


def test_unprepared_tfds_dataset_is_a_clear_error_not_a_download(tmp_path):
    with pytest.raises(tfdist.errors.ConfigurationError, match="not prepared.*does not download"):
        tfdist.data.load_tfds("mnist", "train", data_dir=str(tmp_path))


def test_other_tfds_datasets_go_through_the_same_pipeline():
    with tfds.testing.mock_data(num_examples=48):
        recipes = load_program("recipes")  # strategies/recipes.py, the examples' data
        train, test, info = recipes.image_classification_data("mnist", global_batch_size=16)
        x, y = next(iter(train.make_dataset(0)))
    assert info["input_shape"] == (28, 28, 1)
    assert x.shape == (16, 28, 28, 1) and float(x.numpy().max()) <= 1.0
    assert y.shape == (16,)


def test_prepare_data_command_generates_the_default_dataset(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    program = (
        "import sys; sys.argv = ['tfdist-prepare-data', '--data_dir=%s'];"
        "from tfdist.data.datasets.prepare import main; main()" % tmp_path
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"synthetic_patterns/train: 10000 examples in {tmp_path}" in result.stdout
    assert f"synthetic_patterns/test: 2000 examples in {tmp_path}" in result.stdout
