"""make_strategy("tpu") on a machine without a TPU: a fast, clear TPUNotFoundError.

TensorFlow's TPU search starts servers and threads in the process that runs
it, so the searches run in a child process; each case reports its error
and how long it took.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import tfdist
from tfdist.errors import ConfigurationError
from tfdist.launch.ports import free_ports

_CHILD = textwrap.dedent("""
    import json, sys, time
    import tfdist
    cases = json.loads(sys.argv[1])
    for name, options in cases:
        started = time.monotonic()
        try:
            tfdist.make_strategy("tpu", **options)
            outcome = {"error": None}
        except Exception as error:
            outcome = {"error": type(error).__name__, "message": str(error)}
        outcome["seconds"] = time.monotonic() - started
        print("CASE", json.dumps([name, outcome]), flush=True)
""")


@pytest.fixture(scope="module")
def outcomes():
    cases = [
        ("no arguments", {}),
        ("local", {"tpu": "local"}),
        ("named node", {"tpu": "my-tpu", "zone": "us-central1-b", "project": "my-project"}),
        # Last: a search that gets no answer is left running in its thread.
        ("no answer", {"tpu": f"grpc://127.0.0.1:{free_ports(1)[0]}", "timeout_seconds": 3}),
    ]
    env = {k: v for k, v in os.environ.items()
           if k not in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases)], env=env,
        capture_output=True, text=True, timeout=180,
    )
    found = dict(json.loads(line[5:]) for line in result.stdout.splitlines()
                 if line.startswith("CASE "))
    assert len(found) == len(cases), result.stdout + result.stderr[-3000:]
    return found


@pytest.mark.parametrize("case, tried", [
    ("no arguments", "tpu=None"),
    ("local", "tpu='local'"),
    ("named node", "tpu='my-tpu', zone='us-central1-b', project='my-project'"),
    ("no answer", "tpu='grpc://127.0.0.1:"),
])
def test_no_tpu_is_a_fast_clear_error(outcomes, case, tried):
    outcome = outcomes[case]
    assert outcome["error"] == "TPUNotFoundError", outcome
    message = outcome["message"]
    assert "TPU" in message and tried in message
    # What was tried in the environment, and what to do.
    assert "TPU_NAME unset" in message and "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS unset" in message
    assert "tpu='local'" in message and "static_shapes=True" in message
    assert outcome["seconds"] < 30, outcome


def test_local_without_tpu_devices_names_the_device_files(outcomes):
    assert "/dev/accel*" in outcomes["local"]["message"]
    assert outcomes["local"]["seconds"] < 5


def test_unanswered_search_ends_at_its_timeout(outcomes):
    outcome = outcomes["no answer"]
    assert "within 3 s (timeout_seconds)" in outcome["message"]
    assert 3 <= outcome["seconds"] < 10


def test_tpu_is_a_known_strategy():
    assert "tpu" in tfdist.strategies.known_strategies()


@pytest.mark.parametrize("options, named", [
    ({"tpu": ""}, "`tpu`"),
    ({"tpu": "local", "zone": 3}, "`zone`"),
    ({"tpu": "local", "timeout_seconds": 0}, "`timeout_seconds`"),
])
def test_bad_arguments_name_the_argument(options, named):
    with pytest.raises(ConfigurationError, match=named):
        tfdist.make_strategy("tpu", **options)
