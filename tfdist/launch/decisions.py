"""What the launcher does after each start of its group, as a pure function.

`launch` runs the group, gathers what it knows about how the start ended
into a `Facts` record, and `decide` turns that into a `Decision`: an
`Action` and the number of workers of the next start. Nothing here starts
processes, reads files or prints, so every transition is tested without
a cluster (tests/launch/test_decisions.py); the guide's table lists them
(docs/guides/launcher.md, "What happens after a run").

The checks, in order (the first that holds wins):

1. host discovery asked for a new size, no signal was seen and some worker
   had not finished: `Action.RESIZE` (not a restart);
2. the run succeeded (a stop the launcher asked for itself, with every
   worker done, counts as success): `Action.FINISHED`;
3. SIGINT or SIGTERM reached the launcher: `Action.STOPPED`;
4. a task found its port taken, the ports are the launcher's own choice and
   port retries are left: `Action.NEW_PORTS` (not a restart either);
5. no restarts are left: `Action.GIVE_UP`;
6. a worker died again before joining and the group is above
   ``--min_workers``: `Action.RESTART_SMALLER`; otherwise `Action.RESTART`.

>>> from tfdist.launch.decisions import Action, Facts, decide
>>> facts = Facts(workers=3, fewest_workers=2, restarts=1, max_restarts=2,
...               lost_worker="worker-2")
>>> decide(facts)
Decision(action=<Action.RESTART_SMALLER: 'restart-smaller'>, workers=2)
>>> decide(Facts(workers=3, fewest_workers=3, restarts=1, max_restarts=2,
...              lost_worker="worker-2")).action       # at --min_workers: no shrinking
<Action.RESTART: 'restart'>
"""

import dataclasses
import enum
from typing import Optional

PORT_RETRIES = 3  # starts again after a port was taken, besides --max_restarts


class Action(enum.Enum):
    """What the launcher does next."""

    FINISHED = "finished"  # every task finished: report success and return
    STOPPED = "stopped"  # SIGINT/SIGTERM reached the launcher: report and return
    RESIZE = "resize"  # re-form the group at the size host discovery found
    NEW_PORTS = "new-ports"  # a port was taken: start again on new ports
    RESTART = "restart"  # a task failed: start the group again, same size
    RESTART_SMALLER = "restart-smaller"  # a worker was lost: restart with one fewer
    GIVE_UP = "give-up"  # a task failed and no restarts are left: report and return

    @property
    def ends(self) -> bool:
        """True when the launcher returns (no further start)."""
        return self in (Action.FINISHED, Action.STOPPED, Action.GIVE_UP)

    @property
    def is_restart(self) -> bool:
        """True when the start counts against ``--max_restarts``."""
        return self in (Action.RESTART, Action.RESTART_SMALLER)


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the launcher knows when a start of its group has ended.

    ``ok`` and ``stopped`` describe the group's own result (it succeeded;
    it ended because a stop was asked for, by a signal or by host
    discovery); ``finished`` is that every worker (and the chief) exited 0.
    ``signal_seen``: SIGINT or SIGTERM reached the launcher.
    ``resize_requested`` / ``resize_to``: host discovery stopped the group
    to re-form it at ``resize_to`` workers. ``port_conflict``: the failed
    task said "address already in use"; ``fixed_ports``: the user gave
    ``--ports``. ``restarts`` and ``port_retries`` are the ones used so far.
    ``lost_worker``: the failed task is a worker that died before joining
    the cluster on a restart. ``workers`` is the current size,
    ``fewest_workers`` the ``--min_workers`` floor. ``discovered``: host
    discovery's answer, asked only once a restart is decided (the launcher
    runs the script then, and decides again with it).
    """

    ok: bool = False
    finished: bool = False
    stopped: bool = False
    signal_seen: bool = False
    resize_requested: bool = False
    resize_to: Optional[int] = None
    port_conflict: bool = False
    fixed_ports: bool = False
    port_retries: int = 0
    port_retries_allowed: int = PORT_RETRIES
    restarts: int = 0
    max_restarts: int = 0
    lost_worker: Optional[str] = None
    workers: int = 1
    fewest_workers: int = 1
    discovered: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The next `Action` and the workers of the next start (the current
    size when the action ends the launch)."""

    action: Action
    workers: int


def decide(facts: Facts) -> Decision:
    """The launcher's next step after a start of its group (see the module
    docstring for the order of the checks)."""
    if facts.resize_requested and not facts.signal_seen and not facts.finished:
        return Decision(Action.RESIZE, facts.resize_to)
    # A requested stop ends as the signal says: with no signal (host
    # discovery asked, and every worker had already finished) it succeeded.
    succeeded = not facts.signal_seen if facts.stopped else facts.ok
    if succeeded:
        return Decision(Action.FINISHED, facts.workers)
    if facts.signal_seen:
        return Decision(Action.STOPPED, facts.workers)
    if (facts.port_conflict and not facts.fixed_ports
            and facts.port_retries < facts.port_retries_allowed):
        return Decision(Action.NEW_PORTS, facts.workers)
    if facts.restarts >= facts.max_restarts:
        return Decision(Action.GIVE_UP, facts.workers)
    action, workers = Action.RESTART, facts.workers
    if facts.lost_worker and facts.workers > facts.fewest_workers:
        action, workers = Action.RESTART_SMALLER, facts.workers - 1
    return Decision(action, facts.discovered or workers)
