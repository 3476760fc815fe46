"""The records of a process group (`tfdist.launch.group`): what to start
(`TaskSpec`: a task's name, environment, command, and whether it is a
server or a sidecar) and how a start ended (`GroupResult`)."""

import dataclasses
from typing import Dict, List, Optional, Sequence


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: its name (``worker-1``) and environment additions.

    ``command`` replaces the group's command for this task. A ``server``
    task (a ps or worker under ParameterServerStrategy) is not expected to
    exit: the group succeeds when every other task exited 0, and a server
    that exits, or hangs (stopped for ``hang_timeout``), is started again,
    same port, up to ``max_respawns`` times, else it fails the group. A
    ``sidecar`` task (an evaluator) runs beside the others: its exit or
    hang is reported and never fails the group, which waits for it at the
    end for a bounded time (`ProcessGroup.wait`'s ``sidecar_timeout``).

    >>> from tfdist.launch import TaskSpec
    >>> task = TaskSpec("worker-1", {"TF_CONFIG": '{"task": {"type": "worker", "index": 1}}'})
    >>> task.name, task.server
    ('worker-1', False)
    """

    name: str
    env: Dict[str, str]
    ready_file: Optional[str] = None
    command: Optional[Sequence[str]] = None
    server: bool = False
    max_respawns: int = 0
    sidecar: bool = False


@dataclasses.dataclass(frozen=True)
class GroupResult:
    """How a start ended. ``failed_task`` is the root cause, if any;
    ``stopped_by`` names the signal when a stop was asked for;
    ``exit_codes`` are every task's, from `ProcessGroup.close`. A record:
    the launcher makes a new one (`dataclasses.replace`) to add the exit
    codes, or the signal that stopped the run, never changes one.

    >>> import dataclasses
    >>> from tfdist.launch import GroupResult
    >>> result = GroupResult(1, "worker-1", "exited", ["ValueError: bad input"])
    >>> result.ok
    False
    >>> print(result.summary())
    worker-1: exited (exit code 1)
    last lines of worker-1:
      ValueError: bad input
    >>> closed = dataclasses.replace(result, exit_codes={"worker-0": 143, "worker-1": 1})
    >>> closed.codes()                    # as the launcher adds what `close` returned
    'worker-0=143, worker-1=1'
    """

    exit_code: int
    failed_task: Optional[str] = None
    reason: str = ""
    tail: List[str] = dataclasses.field(default_factory=list)
    stopped_by: Optional[str] = None
    exit_codes: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def codes(self) -> str:
        """``worker-0=143, worker-1=143``."""
        return ", ".join(f"{name}={code}" for name, code in self.exit_codes.items())

    def summary(self) -> str:
        if self.ok:
            return "all tasks finished"
        if self.stopped_by:
            return (f"stopped by {self.stopped_by}{self.reason} "
                    f"(exit codes: {self.codes()})")
        lines = [f"{self.failed_task}: {self.reason} (exit code {self.exit_code})"]
        if self.exit_codes:
            lines[0] += f"; exit codes: {self.codes()}"
        if self.tail:
            lines.append(f"last lines of {self.failed_task}:")
            lines += [f"  {line}" for line in self.tail]
        return "\n".join(lines)


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + signal for a task killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode
