"""``python -m tfdist.launch``: same as ``tfdist-run``."""

from tfdist.launch.cli import run

run()
