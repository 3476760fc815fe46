"""How many workers can run now: a host discovery script, as Horovod
Elastic's ``--host-discovery-script`` and torchrun's ``--nnodes=MIN:MAX``
answer it, for ``tfdist-run --host_discovery=SCRIPT``.

The script is run with no arguments and prints either one integer (the
workers that can run) or one line per host, ``host`` or ``host:slots``
(Horovod's format; the slots are summed, 1 per bare host). It must answer
within `SCRIPT_TIMEOUT` seconds; a script that fails, hangs or prints
something else is reported and its answer ignored (the job keeps its size).

>>> from tfdist.launch.discovery import parse_workers
>>> parse_workers("3\\n"), parse_workers("host-a:2\\nhost-b\\n")
(3, 3)
"""

import subprocess
from typing import Callable, Optional

from tfdist.errors import ConfigurationError

SCRIPT_TIMEOUT = 10.0


def parse_workers(text: str) -> int:
    """The number of workers a discovery script's output announces.

    Raises:
      ValueError: the output is neither one integer nor ``host[:slots]`` lines.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and lines[0].isdigit():
        return int(lines[0])
    total = 0
    for line in lines:
        host, colon, slots = line.partition(":")
        if not host or (colon and not slots.isdigit()) or " " in line:
            raise ValueError(f"not `host` or `host:slots`: {line!r}")
        total += int(slots) if slots else 1
    return total


class HostDiscovery:
    """Runs ``script`` and turns its answer into a group size between
    ``fewest`` and ``most`` workers; ``report`` gets a line for every
    answer it can not use."""

    def __init__(self, script: str, *, fewest: int, most: int,
                 report: Callable[[str], None] = print):
        if not script:
            raise ConfigurationError("`host_discovery` must name an executable script.")
        self.script = script
        self.fewest, self.most = fewest, most
        self._report = report

    def workers(self) -> Optional[int]:
        """The size to run at now (clamped to [fewest, most]); None when the
        script gave no usable answer."""
        try:
            completed = subprocess.run([self.script], capture_output=True, text=True,
                                       timeout=SCRIPT_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            self._report(f"[launcher] host discovery {self.script!r} failed ({error}); "
                         "keeping the current size")
            return None
        if completed.returncode != 0:
            self._report(f"[launcher] host discovery {self.script!r} exited with "
                         f"{completed.returncode}; keeping the current size")
            return None
        try:
            found = parse_workers(completed.stdout)
        except ValueError as error:
            self._report(f"[launcher] host discovery {self.script!r}: {error}; keeping the "
                         "current size")
            return None
        return max(self.fewest, min(self.most, found))
