"""The first thing users type: ``--help`` prints usage with every flag and exits 0."""

import re
import subprocess
import sys

from tfdist.launch import cli


def _run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_tfdist_run_help_lists_every_flag_and_exits_0():
    result = _run("-m", "tfdist.launch", "--help")
    assert result.returncode == 0, result.stderr
    flags = set(re.findall(r'add_argument\("(--\w+)"', open(cli.__file__).read()))
    assert len(flags) > 15
    missing = [flag for flag in flags if flag not in result.stdout]
    assert not missing, missing


def test_tfdist_run_help_after_the_command_belongs_to_the_command(capsys):
    # `tfdist-run --num_workers=2 -- python train.py --help`: not ours.
    assert cli.main(["--num_workers=0", "--", "python", "--help"]) == 2
    assert "num_workers" in capsys.readouterr().err


def test_tfdist_prepare_data_help_exits_0():
    result = _run("-m", "tfdist.data.datasets.prepare", "--help")
    assert result.returncode == 0, result.stderr
    assert "--data_dir" in result.stdout and "--dataset" in result.stdout
