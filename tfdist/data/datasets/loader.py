"""Loads a TFDS dataset by name, split and ``data_dir``, without downloading.

tfdist's own builders (`LOCAL_BUILDERS`) are generated into ``data_dir`` on
first use. Any other TFDS dataset (``mnist``, ``cifar10``, ...) must already
be prepared there (``tfds build`` on a machine with network, then copy the
directory); otherwise a `ConfigurationError` says so.
"""

import contextlib
import fcntl
import os
from typing import Optional

import tensorflow as tf
import tensorflow_datasets as tfds

from tfdist.errors import ConfigurationError

LOCAL_BUILDERS = ("synthetic_patterns",)
# Several files per split, so file-based sharding can give each worker its own.
LOCAL_NUM_SHARDS = 4


def load_supervised(
    name: str,
    split: str,
    *,
    data_dir: Optional[str] = None,
    shuffle_files: bool = False,
) -> tf.data.Dataset:
    """Unbatched ``(features, label)`` pairs of ``name``'s ``split``."""
    local = name.split(":")[0] in LOCAL_BUILDERS
    lock = _preparation_lock(name, data_dir) if local else contextlib.nullcontext()
    try:
        with lock:
            return _load(name, split, data_dir, local, shuffle_files)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ConfigurationError(
            f"Unknown TFDS dataset {name!r}: {error}"
        ) from error
    except AssertionError as error:
        raise ConfigurationError(
            f"TFDS dataset {name!r} is not prepared in data_dir={data_dir!r} "
            "and tfdist does not download. Prepare it on a machine with "
            f"network (`tfds build {name} --data_dir=...`) and pass that "
            f"directory. ({error})"
        ) from error


def _load(name, split, data_dir, local, shuffle_files):
    return tfds.load(
        name,
        split=split,
        data_dir=data_dir,
        as_supervised=True,
        download=local,
        try_gcs=False,
        shuffle_files=shuffle_files,
        download_and_prepare_kwargs={
            "download_config": tfds.download.DownloadConfig(num_shards=LOCAL_NUM_SHARDS)
        }
        if local
        else None,
    )


@contextlib.contextmanager
def _preparation_lock(name: str, data_dir: Optional[str]):
    """Serialises generation: workers on one host share ``data_dir``."""
    directory = os.path.expanduser(data_dir or "~/tensorflow_datasets")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f".{name}.tfdist-lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
