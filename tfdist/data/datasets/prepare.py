"""``tfdist-prepare-data``: generate tfdist's local TFDS datasets into a directory.

    tfdist-prepare-data --data_dir=/data/tfds [--dataset=synthetic_patterns]

Useful before a multi-worker job, so workers read prepared files instead of
racing to generate them.
"""

import argparse
from typing import Optional, Sequence

from tfdist.data.datasets.loader import load_supervised, LOCAL_BUILDERS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdist-prepare-data",
        description="Generate tfdist's local TFDS datasets into a directory.",
        epilog="Generates the train and test splits and prints their sizes.")
    parser.add_argument("--data_dir", required=True, help="TFDS data directory.")
    parser.add_argument("--dataset", default=LOCAL_BUILDERS[0], choices=LOCAL_BUILDERS,
                        help="Which local dataset (default %(default)s).")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point; ``--help`` prints usage and exits 0."""
    args = _parser().parse_args(argv)
    for split in ("train", "test"):
        count = int(load_supervised(args.dataset, split, data_dir=args.data_dir).cardinality())
        print(f"{args.dataset}/{split}: {count} examples in {args.data_dir}")


if __name__ == "__main__":
    main()
