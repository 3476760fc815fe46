"""``python -m tfdist``: versions, devices and the cluster role, for bug reports."""

import json
import os
import pathlib
import subprocess
import sys

import tfdist
from tfdist import info, versions


def test_python_m_tfdist_prints_versions_devices_and_role():
    tf_config = {"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                 "task": {"type": "worker", "index": 0}}
    env = dict(os.environ, TF_CONFIG=json.dumps(tf_config))
    result = subprocess.run([sys.executable, "-m", "tfdist"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"tfdist {tfdist.__version__}" in out and "tensorflow 2." in out and "keras 3." in out
    assert "(supported)" in out or "not supported: tfdist supports" in out
    assert "CPU: " in out and "GPU: " in out and "TPU: " in out
    assert "task worker-0 (not chief); cluster: chief x1, worker x1" in out


def test_a_reader_that_stops_early_gets_no_traceback():
    """``python -m tfdist | head -1``: the reader is gone before the report
    is written (here: a pipe whose reading end is already closed); the
    command ends quietly, as CI's scripts read it."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "tfdist"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=120,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    finally:
        os.close(write_end)
    assert "BrokenPipeError" not in result.stderr and "Traceback" not in result.stderr, (
        result.stderr)


def test_a_missing_device_kind_says_why():
    text = info.report(environ={"CUDA_VISIBLE_DEVICES": "-1"})
    gpu_line = next(line for line in text.splitlines() if line.startswith("GPU:"))
    assert gpu_line.startswith("GPU: 0 (") and ("CUDA" in gpu_line)
    assert "TF_CONFIG: not set" in text


def test_a_malformed_tf_config_is_reported_not_raised():
    text = info.report(environ={"TF_CONFIG": '{"cluster": {"worker": ["nohost"]}}'})
    assert "TF_CONFIG: invalid:" in text


def test_setup_py_and_the_versions_page_say_what_tfdist_versions_says():
    """One list of supported versions (`tfdist.versions`): the pins in
    ``setup.py`` admit exactly those minors, and docs/versions.md names them."""
    repo = pathlib.Path(__file__).resolve().parents[1]
    setup = (repo / "setup.py").read_text()
    oldest, newest = versions.TENSORFLOW[0], versions.TENSORFLOW[-1]
    following = f"{newest.split('.')[0]}.{int(newest.split('.')[1]) + 1}"
    assert f'"tensorflow>={oldest},<{following}"' in setup
    # Keras comes with TensorFlow (keras-nightly beside its release
    # candidates): setup.py names no Keras, tfdist checks it when it loads.
    assert '"keras' not in setup.split("install_requires")[1].split("]")[0]
    page = (repo / "docs" / "versions.md").read_text()
    for minor in versions.TENSORFLOW + versions.KERAS:
        assert f"| {minor} " in page or f"{minor}." in page, minor
    for tensorflow, keras in versions.PAIRS:
        assert f"| {tensorflow}." in page and f"| {keras}." in page, (tensorflow, keras)
    assert {tf for tf, _ in versions.PAIRS} == set(versions.TENSORFLOW)
    assert {keras for _, keras in versions.PAIRS} == set(versions.KERAS)


def test_an_unsupported_version_is_named():
    assert versions.support("tensorflow", "2.18.0").startswith("not supported: tfdist supports "
                                                              "TensorFlow 2.19")
    assert versions.support("keras", "3.15.1") == "supported"
