"""``tfdist-prepare-data``: generate tfdist's local TFDS datasets into a directory.

    tfdist-prepare-data --data_dir=/data/tfds [--dataset=synthetic_patterns]

Useful before a multi-worker job, so workers read prepared files instead of
racing to generate them.
"""

from absl import app, flags

from tfdist.data.datasets.loader import load_supervised, LOCAL_BUILDERS

_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory.", required=True)
_DATASET = flags.DEFINE_enum(
    "dataset", LOCAL_BUILDERS[0], LOCAL_BUILDERS, "Which local dataset."
)


def _main(argv):
    del argv
    for split in ("train", "test"):
        count = int(load_supervised(_DATASET.value, split, data_dir=_DATA_DIR.value).cardinality())
        print(f"{_DATASET.value}/{split}: {count} examples in {_DATA_DIR.value}")


def main():
    app.run(_main)
