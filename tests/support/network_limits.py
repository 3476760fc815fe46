"""Whether this machine can run ``tfdist-run --bandwidth`` (Linux, root,
unshare / ip / tc, the tbf qdisc): tests that need it skip with the reason."""

import subprocess

import pytest

from tfdist.errors import ConfigurationError
from tfdist.launch import network


def why_not() -> str:
    """'' if a limited namespace can be made here, else the reason."""
    try:
        network.check_can_limit()
    except ConfigurationError as error:
        return str(error)
    probe = subprocess.run(network.limited_command("1gbit", ["true"]), capture_output=True,
                           text=True, timeout=60)
    return "" if probe.returncode == 0 else f"tc could not limit a namespace: {probe.stderr}"


_REASON = why_not()
needs_namespaces = pytest.mark.skipif(bool(_REASON), reason=_REASON or "-")
