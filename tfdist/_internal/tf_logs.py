"""TensorFlow's C++ start-up noise: hidden by default, ``TFDIST_TF_LOGS=1`` shows it.

On a CPU machine TensorFlow 2.21 prints lines like these before any output
of the user's own, and again in every worker of a cluster:

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1795379349.087811   10320 cudart_stub.cc:31] Could not find cuda drivers ...
    I0000 00:00:1795379349.511702   10320 cpu_feature_guard.cc:227] This TensorFlow binary ...
    To enable the following instructions: AVX2 FMA, in other operations, rebuild ...
    E0000 00:00:1795379394.673094   10468 cuda_platform.cc:52] failed call to cuInit: ...

TensorFlow 2.22 follows the cuInit line with a source trace:

    === Source Location Trace: ===
    external/xla/xla/stream_executor/cuda/cuda_status.cc:50

They are written by C++ before Python's logging exists, so no TensorFlow
setting hides them (``TF_CPP_MIN_LOG_LEVEL`` does not). tfdist:

- sets ``TF_CPP_MIN_LOG_LEVEL=2`` where it is unset (TensorFlow's later
  INFO and WARNING lines; errors still print), at ``import tfdist`` and in
  the tasks ``tfdist-run`` starts;
- runs TensorFlow's import and runtime start-up (`quietly`) with the
  process's stderr going to a temporary file, then writes back every line
  that is not start-up noise (`is_noise`), so nothing else is lost;
- drops start-up noise from ``tfdist-run``'s console (its ``--log_dir``
  files keep every line).

A script that imports TensorFlow before tfdist sees TensorFlow's own import
lines. Set ``TFDIST_TF_LOGS=1`` (or ``tfdist-run --tf_logs``) to see all of
it.
"""

import contextlib
import os
import re
import sys
import tempfile

SWITCH = "TFDIST_TF_LOGS"

# absl/TSL's prefix: severity, MMDD, time, thread id, file:line].
_CPP_PREFIX = r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
_NOISE = re.compile(
    "|".join((
        r"^WARNING: All log messages before absl::InitializeLog\(\) is called",
        rf"^[IW]\d{{4}} \d\d:\d\d:\d+\.\d+\s+\d+ \S+\.cc:\d+\] ",
        rf"^{_CPP_PREFIX}cuda_\w+\.cc:\d+\] failed call to cuInit",
        # TensorFlow 2.19's own prefix (date, time, severity, file:line]):
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [EW] \S+/cuda_\w+\.cc:\d+\] "
        r"failed call to cuInit",
        r"^To enable the following instructions: .* rebuild TensorFlow",
    ))
)
# Lines that continue a start-up record (TensorFlow 2.22's source trace
# after a failed cuInit): noise only right after a noise line (`NoiseFilter`).
_CONTINUATION = re.compile(
    r"^(=== Source Location Trace: ===\s*|[\w./-]+\.(cc|h|cpp):\d+\s*|\s*)$")
_GPU_FAILURE = re.compile(r"cuInit|cuda drivers|dlopen|libcud|CUDA|GPU", re.IGNORECASE)
_quiet_depth = 0
# Start-up lines about GPUs that `quietly` hid (e.g. "failed call to cuInit:
# ..."): `tfdist.strategies.local_devices` shows them when a machine with
# GPUs ends up with none.
gpu_lines = []


def shown() -> bool:
    """Whether the user asked for TensorFlow's logs (``TFDIST_TF_LOGS=1``)."""
    return os.environ.get(SWITCH, "").strip().lower() not in ("", "0", "false", "no")


def is_noise(line: str) -> bool:
    """True for TensorFlow's C++ INFO/WARNING lines and CPU-only start-up lines."""
    return bool(_NOISE.match(line))


class NoiseFilter:
    """Start-up noise, line by line, with what continues it: `is_noise`
    lines, and right after one the lines of its source trace and a blank
    line (`keep` is False for each). A line that is not noise ends the record.

    >>> noise = NoiseFilter()
    >>> [noise.keep(line) for line in ("I0000 00:00:1.2   7 cuda_platform.cc:57] failed call to cuInit",
    ...                                "=== Source Location Trace: ===", "external/a/b.cc:50", "",
    ...                                "result 2", "")]
    [False, False, False, False, True, True]
    """

    def __init__(self):
        self._in_record = False

    def keep(self, line: str) -> bool:
        """Whether ``line`` (without its newline) is not start-up noise."""
        stripped = line.rstrip("\r\n")
        if is_noise(stripped) or (self._in_record and _CONTINUATION.match(stripped)):
            self._in_record = True
            return False
        self._in_record = False
        return True


def quiet_environment(env=None) -> dict:
    """``env`` (default ``os.environ``, changed in place) with
    ``TF_CPP_MIN_LOG_LEVEL=2`` unless set or TensorFlow's logs are asked for."""
    env = os.environ if env is None else env
    if not shown():
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


@contextlib.contextmanager
def quietly():
    """Runs the block with stderr (file descriptor 2) captured; afterwards,
    every captured line that is not start-up noise is written back, also
    when the block raises. Re-entrant; a no-op when logs are asked for."""
    global _quiet_depth  # pylint: disable=global-statement
    if shown() or _quiet_depth:
        yield
        return
    _quiet_depth += 1
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            _quiet_depth -= 1
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(True)
            noise = NoiseFilter()
            kept = [line for line in lines if noise.keep(line)]
            gpu_lines.extend(line.strip() for line in lines
                             if is_noise(line) and _GPU_FAILURE.search(line))
            if kept:
                os.write(2, "".join(kept).encode())


def import_module(name: str):
    """``importlib.import_module(name)``, quietly when it is what first
    imports TensorFlow."""
    import importlib  # pylint: disable=import-outside-toplevel

    if "tensorflow" in sys.modules:
        return importlib.import_module(name)
    with quietly():
        module = importlib.import_module(name)
        tensorflow = sys.modules.get("tensorflow")
        if tensorflow is not None:
            # Listing devices probes for GPUs (the failed cuInit line) but
            # starts no runtime: logical devices can still be configured.
            tensorflow.config.list_physical_devices()
        return module
