"""Pipeline schedules: the order in which each stage runs the forward and
backward passes of a step's micro-batches.

A pipeline cuts a model into S stages on S devices and a batch into m
micro-batches. Stage s runs the forward pass of micro-batch k (``F k``)
once stage s - 1 has, and its backward pass (``B k``) once stage s + 1 has
and its own ``F k`` ran. Within those rules a schedule only chooses each
stage's order, and with it how many micro-batches' activations a stage
holds at once:

- ``"gpipe"`` (GPipe, Huang et al. 2019): every forward, then every
  backward. Stage s holds the activations of all m micro-batches.
- ``"1f1b"`` (PipeDream-flush, as Megatron-LM and PyTorch's
  ``Schedule1F1B`` run it): stage s runs ``min(S - 1 - s, m)`` forwards
  to fill the pipeline, then alternates one forward and one backward, and
  drains with the remaining backwards. Stage s holds at most ``S - s``
  micro-batches' activations, whatever m is.

Both leave the same idle time per stage (the bubble): ``(S - 1) / (m + S -
1)`` of a step when every action takes the same time (`bubble_fraction`).
`simulate` runs the orders on that model, so a schedule that would wait
forever is an error here, before anything is traced.

Schedules are data: `REGISTRY` maps each name to the function that makes
its orders, and ``Pipeline(schedule=...)`` also takes a user-given order,
one line per stage (`format_orders` prints a schedule so, `parse_orders`
reads it back; `orders_for` checks it).

>>> [str(action) for action in stage_orders("1f1b", stages=3, micro_batches=4)[0]]
['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
>>> [str(action) for action in stage_orders("1f1b", stages=3, micro_batches=4)[2]]
['F0', 'B0', 'F1', 'B1', 'F2', 'B2', 'F3', 'B3']
>>> simulate(stage_orders("gpipe", stages=2, micro_batches=3)).grid
['F0 F1 F2 .  .  B2 B1 B0', '.  F0 F1 F2 B2 B1 B0 .']
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

FORWARD, BACKWARD = "F", "B"


@dataclasses.dataclass(frozen=True)
class Action:
    """One stage's forward (``"F"``) or backward (``"B"``) pass of one
    micro-batch; printed ``F3`` / ``B0`` and parsed back (`parse_orders`)."""

    kind: str
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro_batch}"


def _gpipe(stages: int, micro_batches: int) -> List[List[Action]]:
    forwards = [Action(FORWARD, k) for k in range(micro_batches)]
    # (backwards last micro-batch first, as the last stage finishes them)
    return [forwards + [Action(BACKWARD, k) for k in reversed(range(micro_batches))]
            for _ in range(stages)]


def _one_forward_one_backward(stages: int, micro_batches: int) -> List[List[Action]]:
    forwards = [Action(FORWARD, k) for k in range(micro_batches)]
    orders = []
    for stage in range(stages):
        warmup = min(stages - 1 - stage, micro_batches)
        order = forwards[:warmup]
        for k in range(micro_batches - warmup):
            order += [forwards[warmup + k], Action(BACKWARD, k)]
        order += [Action(BACKWARD, k) for k in range(micro_batches - warmup, micro_batches)]
        orders.append(order)
    return orders


# The named schedules: name -> (stages, micro-batches) -> each stage's order.
REGISTRY: Dict[str, Callable[[int, int], List[List[Action]]]] = {
    "gpipe": _gpipe,
    "1f1b": _one_forward_one_backward,
}
SCHEDULES = tuple(REGISTRY)


def stage_orders(schedule: str, *, stages: int, micro_batches: int) -> List[List[Action]]:
    """Each stage's actions in the order the named ``schedule`` runs them
    (module doc; `REGISTRY`).

    >>> [str(a) for a in stage_orders("gpipe", stages=2, micro_batches=2)[1]]
    ['F0', 'F1', 'B1', 'B0']
    """
    if schedule not in REGISTRY:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}.")
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"a pipeline needs at least one stage and one micro-batch; got "
                         f"stages={stages}, micro_batches={micro_batches}.")
    return REGISTRY[schedule](stages, micro_batches)


def format_orders(orders: Sequence[Sequence[Action]]) -> List[str]:
    """Each stage's order as one line of actions, as `parse_orders` reads it.

    >>> format_orders(stage_orders("1f1b", stages=2, micro_batches=2))
    ['F0 F1 B0 B1', 'F0 B0 F1 B1']
    """
    return [" ".join(str(action) for action in order) for order in orders]


def parse_orders(lines: Sequence[str]) -> List[List[Action]]:
    """A user-given schedule: one line per stage of actions ``F<k>`` /
    ``B<k>`` separated by spaces (what `format_orders` prints).

    >>> [[str(a) for a in order] for order in parse_orders(["F0 F1 B1 B0", "F0 B0 F1 B1"])]
    [['F0', 'F1', 'B1', 'B0'], ['F0', 'B0', 'F1', 'B1']]
    """
    if isinstance(lines, str):
        raise ValueError(f"a schedule's order is a list of lines, one per stage; got {lines!r}.")
    orders = []
    for stage, line in enumerate(lines):
        if not isinstance(line, str):
            raise ValueError(f"stage {stage}'s order must be a line such as 'F0 F1 B0 B1'; "
                             f"got {line!r}.")
        order = []
        for word in line.split():
            kind, number = word[:1], word[1:]
            if kind not in (FORWARD, BACKWARD) or not number.isdigit():
                raise ValueError(f"stage {stage}'s order: {word!r} is not an action (F<k> or "
                                 f"B<k>, k a micro-batch); the line was {line!r}.")
            order.append(Action(kind, int(number)))
        orders.append(order)
    return orders


def orders_for(schedule, *, stages: int, micro_batches: int) -> List[List[Action]]:
    """The orders ``schedule`` gives: a name in `REGISTRY`, or a
    user-given order (one line per stage, `parse_orders`), checked for
    ``stages`` and ``micro_batches`` and run on the unit-time model
    (`simulate`), so that an order that would wait forever is an error
    naming the stage and action, before anything is traced."""
    if isinstance(schedule, str):
        orders = stage_orders(schedule, stages=stages, micro_batches=micro_batches)
    else:
        orders = parse_orders(schedule)
        if len(orders) != stages:
            raise ValueError(f"the order gives {len(orders)} stage(s); the pipeline has "
                             f"{stages}.")
    simulate(orders, micro_batches=micro_batches)
    return orders


@dataclasses.dataclass
class Simulation:
    """The orders run with every action taking one time unit.

    Attributes:
      start: ``(stage, action) -> time`` each action started at.
      steps: the time the last action ended at.
      grid: per stage, what it ran at each time (``.`` idle).
      most_in_flight: per stage, the most micro-batches whose forward pass
        had run and whose backward pass had not (the activations held).
    """

    start: Dict[Tuple[int, Action], int]
    steps: int
    grid: List[str]
    most_in_flight: List[int]


def simulate(orders: Sequence[Sequence[Action]],
             micro_batches: Optional[int] = None) -> Simulation:
    """Runs ``orders`` (one list per stage) on the unit-time model.
    ``micro_batches``: how many each stage must run (default: as many as
    the first stage's forward passes).

    Raises:
      ValueError: an order waits forever (it runs an action before one it
        depends on could run: the error names each stage's waiting action
        and what it waits for), or misses or repeats an action.
    """
    stages = len(orders)
    if micro_batches is None:
        micro_batches = sum(a.kind == FORWARD for a in orders[0]) if orders else 0
    expected = sorted((kind, k) for kind in (FORWARD, BACKWARD) for k in range(micro_batches))
    for stage, order in enumerate(orders):
        if sorted((a.kind, a.micro_batch) for a in order) != expected:
            raise ValueError(f"stage {stage} must run F and B of micro-batches "
                             f"0..{micro_batches - 1} once each; got {[str(a) for a in order]}")
    end: Dict[Tuple[int, Action], int] = {}
    start: Dict[Tuple[int, Action], int] = {}
    position = [0] * stages
    time = 0
    while any(position[s] < len(orders[s]) for s in range(stages)):
        ran = []
        for stage in range(stages):
            if position[stage] == len(orders[stage]):
                continue
            action = orders[stage][position[stage]]
            if all(end.get(need, time + 1) <= time for need in _needs(stage, action, stages)):
                ran.append((stage, action))
        if not ran:
            waiting = []
            for stage in range(stages):
                if position[stage] == len(orders[stage]):
                    continue
                action = orders[stage][position[stage]]
                needs = [f"{need} on stage {other}" for other, need in
                         _needs(stage, action, stages) if (other, need) not in end]
                waiting.append(f"stage {stage} at {action} (waits for {', '.join(needs)})")
            raise ValueError(f"the schedule waits forever at time {time}: "
                             + "; ".join(waiting))
        for stage, action in ran:
            start[(stage, action)] = time
            end[(stage, action)] = time + 1
            position[stage] += 1
        time += 1
    grid, most = [], []
    for stage in range(stages):
        cells, held, peak = ["." + " "] * time, 0, 0
        for action in orders[stage]:
            cells[start[(stage, action)]] = f"{action}".ljust(2)
        for action in sorted(orders[stage], key=lambda a: start[(stage, a)]):
            held += 1 if action.kind == FORWARD else -1
            peak = max(peak, held)
        grid.append(" ".join(cells).rstrip())
        most.append(peak)
    return Simulation(start, time, grid, most)


def _needs(stage: int, action: Action, stages: int) -> List[Tuple[int, Action]]:
    k = action.micro_batch
    if action.kind == FORWARD:
        return [(stage - 1, action)] if stage > 0 else []
    needs = [(stage, Action(FORWARD, k))]
    return needs + ([(stage + 1, action)] if stage < stages - 1 else [])


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The share of a step a stage is idle when every action takes the same
    time: ``(S - 1) / (m + S - 1)``.

    >>> bubble_fraction(4, 8)
    0.2727272727272727
    """
    return (stages - 1) / (micro_batches + stages - 1)
