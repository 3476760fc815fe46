"""A slow network on one machine: ``tfdist-run --bandwidth=1gbit``.

Real multi-worker jobs talk over 1-25 Gbit/s Ethernet; a local cluster
talks over loopback at ~25 Gbit/s. ``--bandwidth=RATE`` runs the launcher
and every task in a fresh network namespace whose loopback is limited to
``RATE`` by a token-bucket filter (``tc qdisc add dev lo root tbf``), so
communication costs what it would on such a network.

The namespace is made with ``unshare --net``: it belongs to the launcher's
process tree and disappears when the last process in it exits, so nothing
is left behind, also after a crash or SIGKILL. Linux and root are needed
(``CAP_NET_ADMIN``); elsewhere it is a clear error.

**The topology this models.** Every task's traffic crosses the one
limited loopback: the tasks share one link of ``RATE`` (as hosts behind one
shared uplink), rather than each having a link of its own (a switched
network). A ring all-reduce of ``B`` bytes over ``N`` workers sends
``2 (N-1)/N * B`` bytes per worker: on a switched network each worker's link
carries that at once, ``2 (N-1)/N * B / RATE`` seconds; on the shared link
all ``N`` workers' traffic queues on it, ``2 (N-1) * B / RATE`` seconds,
``N`` times longer. Per-link limits would need one namespace per task,
joined by veth pairs with a limit on each.

>>> from tfdist.launch.network import bits_per_second
>>> bits_per_second("1gbit"), bits_per_second("500mbit"), bits_per_second("10gbit")
(1000000000.0, 500000000.0, 10000000000.0)
"""

import os
import re
import shlex
import shutil
import sys
from typing import Sequence

from tfdist.errors import ConfigurationError

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(" + "|".join(sorted(_UNITS, key=len, reverse=True)) + r")$")
LATENCY = "50ms"  # how long a packet may wait in the bucket's queue
ENV = "TFDIST_BANDWIDTH"  # set inside the namespace: the rate its loopback has


def bits_per_second(rate: str) -> float:
    """``rate`` in tc's notation (``1gbit``, ``500mbit``, ``100mbps``) as bits/s."""
    match = _RATE.match(str(rate).strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f"`--bandwidth` ({rate!r}) is not a rate: give a number and a unit of tc, "
            "e.g. --bandwidth=1gbit, 10gbit or 500mbit.")
    return float(match.group(1)) * _UNITS[match.group(2)]


def burst_bytes(bits: float) -> int:
    """The bucket: at least 256 KiB, and one 250 Hz timer tick at ``bits``/s
    (a smaller bucket than the rate sends per tick cannot reach the rate)."""
    return max(256 * 1024, int(bits / 8 / 250))


def check_can_limit() -> None:
    """Raises `ConfigurationError` if this machine cannot make the namespace."""
    if not sys.platform.startswith("linux"):
        raise ConfigurationError(
            f"`--bandwidth` needs Linux network namespaces and tc; this is {sys.platform}. "
            "Run without --bandwidth.")
    if os.geteuid() != 0:
        raise ConfigurationError(
            "`--bandwidth` needs root (CAP_NET_ADMIN) to make a network namespace and "
            "limit its loopback with tc; run tfdist-run as root, or without --bandwidth.")
    missing = [tool for tool in ("unshare", "ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ConfigurationError(
            f"`--bandwidth` needs {', '.join(missing)} (util-linux, iproute2) on the PATH; "
            "install them or run without --bandwidth.")


def limited_command(rate: str, argv: Sequence[str]) -> list:
    """The command that runs ``argv`` in a fresh network namespace whose
    loopback is limited to ``rate``; tc's error, if any, ends it with code 2."""
    bits = bits_per_second(rate)
    setup = (f"ip link set lo up && tc qdisc add dev lo root tbf rate {int(bits)}bit "
             f"burst {burst_bytes(bits)} latency {LATENCY} || "
             f"{{ echo 'tfdist-run: could not limit the loopback to {rate} with tc "
             f"(the kernel needs the tbf qdisc)' >&2; exit 2; }}")
    return ["unshare", "--net", "sh", "-c", f"{setup}; exec {shlex.join(argv)}"]


def inside(rate: str) -> bool:
    """Whether this process runs in the namespace `exec_limited` made for ``rate``."""
    return os.environ.get(ENV) == rate


def exec_limited(rate: str, argv: Sequence[str]) -> None:
    """Replaces this process by ``argv`` run under `limited_command` (the
    same pid, so signals to tfdist-run still reach the launcher), with
    ``TFDIST_BANDWIDTH`` set to ``rate`` (`inside`)."""
    check_can_limit()
    command = limited_command(rate, argv)
    os.environ[ENV] = rate
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)
