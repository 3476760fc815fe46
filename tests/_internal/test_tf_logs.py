"""TensorFlow's C++ start-up noise is hidden by default, nothing else is, and
TFDIST_TF_LOGS=1 / tfdist-run --tf_logs shows it (real subprocesses)."""

import os
import subprocess
import sys

import pytest

from tfdist._internal import tf_logs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795379349.087811   10320 cudart_stub.cc:31] Could not find cuda drivers "
    "on your machine, GPU will not be used.",
    "I0000 00:00:1795379349.511702   10320 cpu_feature_guard.cc:227] This TensorFlow binary "
    "is optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    "E0000 00:00:1795394.673094   10468 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    # TensorFlow 2.19's prefix
    "2026-12-01 22:08:13.140345: E external/local_xla/xla/stream_executor/cuda/"
    "cuda_platform.cc:51] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: "
    "UNKNOWN ERROR (303)",
]
KEPT = [
    "E0000 00:00:1795394.673094   10468 collective_ops.cc:12] Collective timed out",
    "Traceback (most recent call last):",
    "train | epoch 1 | step 20/79 | loss 2.1671",
    "WARNING:tensorflow:Value in checkpoint could not be found",
]


@pytest.mark.parametrize("line", NOISE)
def test_start_up_lines_are_noise(line):
    assert tf_logs.is_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_errors_and_program_output_are_not_noise(line):
    assert not tf_logs.is_noise(line)


SCRIPT = r"""
import sys
import tfdist
tfdist.import_tensorflow()
import tensorflow as tf
strategy = tfdist.make_strategy("mirrored", num_replicas=2)
print("result", strategy.num_replicas_in_sync, flush=True)
print("my own warning", file=sys.stderr, flush=True)
"""


def _run(env_extra):
    env = {k: v for k, v in os.environ.items()
           if k not in (tf_logs.SWITCH, "TF_CPP_MIN_LOG_LEVEL")}
    env.update(env_extra, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120, check=True)


def test_a_script_importing_tensorflow_through_tfdist_prints_only_its_own_lines():
    quiet = _run({})
    assert quiet.stdout == "result 2\n"
    assert quiet.stderr == "my own warning\n"
    loud = _run({tf_logs.SWITCH: "1"})
    assert loud.stdout == "result 2\n"
    assert any(tf_logs.is_noise(line) for line in loud.stderr.splitlines()), loud.stderr


def test_quietly_gives_back_what_is_not_noise_also_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError):
        with tf_logs.quietly():
            os.write(2, (NOISE[1] + "\nkeep me\n").encode())
            raise RuntimeError("boom")
    assert capfd.readouterr().err == "keep me\n"


TRACE = ["=== Source Location Trace: === ", "external/xla/xla/stream_executor/cuda/cuda_status.cc:50",
         ""]  # TensorFlow 2.22 writes these after its failed cuInit line (NOISE[4])


def test_the_source_trace_after_a_start_up_line_is_noise_and_ends_at_the_next_real_line(capfd):
    with tf_logs.quietly():
        os.write(2, "\n".join([NOISE[4], *TRACE, "keep me", "", "x.cc:1", ""]).encode())
    assert capfd.readouterr().err == "keep me\n\nx.cc:1\n"
    # The trace's lines alone, with no start-up line before them, are kept.
    noise = tf_logs.NoiseFilter()
    assert [noise.keep(line) for line in TRACE[:2]] == [True, True]


def test_tfdist_run_console_drops_noise_and_log_files_keep_it(tmp_path):
    program = tmp_path / "noisy.py"
    program.write_text(
        "import sys\n"
        f"print({NOISE[1]!r}, file=sys.stderr)\n"
        "print('hello', flush=True)\n")
    env = {k: v for k, v in os.environ.items() if k != tf_logs.SWITCH}
    env["PYTHONPATH"] = ROOT

    def launch(*flags):
        return subprocess.run(
            [sys.executable, "-m", "tfdist.launch", "--num_workers=1", "--start_timeout=0",
             f"--log_dir={tmp_path}", *flags, "--", sys.executable, str(program)],
            env=env, capture_output=True, text=True, timeout=120, check=True).stdout

    console = launch()
    assert "[worker-0] hello" in console and "cudart_stub" not in console
    assert "cudart_stub" in (tmp_path / "worker-0.log").read_text()
    assert "cudart_stub" in launch("--tf_logs")
