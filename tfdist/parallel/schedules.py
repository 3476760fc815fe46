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

**Several stages per device** (``stages_per_device=v``, the interleaved
schedule of Narayanan et al. 2021, Megatron-LM's virtual pipeline stages,
PyTorch's ``ScheduleInterleaved1F1B``): S = p·v stages on p devices,
stage s on device ``s mod p``, so each device holds v small chunks of the
model spread along it rather than one long run of layers. An action
then names its stage, ``F3@2`` (micro-batch 3's forward pass through
stage 2), and an order is one line per device. ``"interleaved_1f1b"``
runs Megatron-LM's order: device d warms up with ``2 (p - 1 - d) + (v -
1) p`` forwards (all of them when m = p), then alternates, taking the
micro-batches p at a time through each of its stages in turn (so m must
be a multiple of p). Each action is 1/v of a stage's work, and the fill
and drain shrink with it: the bubble is ``(p - 1) / (v·m + p - 1)``, for
more activations held during the warm-up.

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
>>> format_orders(stage_orders("interleaved_1f1b", stages=4, micro_batches=2,
...                            stages_per_device=2))
['F0@0 F1@0 F0@2 F1@2 B0@2 B1@2 B0@0 B1@0', 'F0@1 F1@1 F0@3 F1@3 B0@3 B1@3 B0@1 B1@1']
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

FORWARD, BACKWARD = "F", "B"


@dataclasses.dataclass(frozen=True)
class Action:
    """One forward (``"F"``) or backward (``"B"``) pass of one micro-batch
    through one stage; printed ``F3`` / ``B0`` and parsed back
    (`parse_orders`). ``stage``: the stage it passes through when a
    device runs several (printed ``F3@2``); None: the one stage of the
    device whose order holds it."""

    kind: str
    micro_batch: int
    stage: Optional[int] = None

    def __str__(self) -> str:
        text = f"{self.kind}{self.micro_batch}"
        return text if self.stage is None else f"{text}@{self.stage}"

    def on_stage(self, device: int) -> int:
        """The stage this action passes through, in the order of ``device``."""
        return device if self.stage is None else self.stage

    @property
    def pass_(self) -> "Action":
        """The action without its stage: the key of a stage's pass."""
        return Action(self.kind, self.micro_batch)


def _gpipe(stages: int, micro_batches: int, stages_per_device: int) -> List[List[Action]]:
    _one_stage_per_device("gpipe", stages_per_device)
    forwards = [Action(FORWARD, k) for k in range(micro_batches)]
    # (backwards last micro-batch first, as the last stage finishes them)
    return [forwards + [Action(BACKWARD, k) for k in reversed(range(micro_batches))]
            for _ in range(stages)]


def _one_forward_one_backward(stages: int, micro_batches: int,
                              stages_per_device: int) -> List[List[Action]]:
    _one_stage_per_device("1f1b", stages_per_device)
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


def _interleaved(stages: int, micro_batches: int,
                 stages_per_device: int) -> List[List[Action]]:
    """Megatron-LM's interleaved 1F1B (module doc): with v stages per
    device, device d's k-th forward is micro-batch ``(k // pv) p + k mod p``
    through its ``(k // p) mod v``-th stage, its k-th backward the same
    micro-batch through its stages from the last."""
    if stages_per_device == 1:
        return _one_forward_one_backward(stages, micro_batches, 1)
    devices = stages // stages_per_device
    if micro_batches % devices:
        raise ValueError(
            f"'interleaved_1f1b' takes the micro-batches {devices} at a time (one per "
            f"device) through each stage: micro_batches ({micro_batches}) must be a "
            f"multiple of the {devices} devices; or give an order of one's own.")
    group, total = devices * stages_per_device, micro_batches * stages_per_device

    def action(kind: str, k: int, device: int) -> Action:
        chunk = (k % group) // devices
        if kind == BACKWARD:
            chunk = stages_per_device - 1 - chunk
        return Action(kind, (k // group) * devices + k % devices, chunk * devices + device)

    orders = []
    for device in range(devices):
        warmup = total if micro_batches == devices else min(
            total, 2 * (devices - 1 - device) + (stages_per_device - 1) * devices)
        order = [action(FORWARD, k, device) for k in range(warmup)]
        for k in range(total - warmup):
            order += [action(FORWARD, warmup + k, device), action(BACKWARD, k, device)]
        order += [action(BACKWARD, k, device) for k in range(total - warmup, total)]
        orders.append(order)
    return orders


def _one_stage_per_device(name: str, stages_per_device: int) -> None:
    if stages_per_device != 1:
        raise ValueError(
            f"{name!r} runs one stage per device; with stages_per_device="
            f"{stages_per_device} use 'interleaved_1f1b' or an order of one's own.")


# The named schedules: name -> (stages, micro-batches, stages per device)
# -> each device's order.
REGISTRY: Dict[str, Callable[[int, int, int], List[List[Action]]]] = {
    "gpipe": _gpipe,
    "1f1b": _one_forward_one_backward,
    "interleaved_1f1b": _interleaved,
}
SCHEDULES = tuple(REGISTRY)


def stage_orders(schedule: str, *, stages: int, micro_batches: int,
                 stages_per_device: int = 1) -> List[List[Action]]:
    """Each device's actions in the order the named ``schedule`` runs them
    (module doc; `REGISTRY`): one list per stage with one stage per device.

    >>> [str(a) for a in stage_orders("gpipe", stages=2, micro_batches=2)[1]]
    ['F0', 'F1', 'B1', 'B0']
    """
    if schedule not in REGISTRY:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}.")
    _check_sizes(stages, micro_batches, stages_per_device)
    return REGISTRY[schedule](stages, micro_batches, stages_per_device)


def _check_sizes(stages: int, micro_batches: int, stages_per_device: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"a pipeline needs at least one stage and one micro-batch; got "
                         f"stages={stages}, micro_batches={micro_batches}.")
    if stages_per_device < 1 or stages % stages_per_device:
        raise ValueError(f"stages_per_device ({stages_per_device}) must divide the "
                         f"{stages} stages (stage s runs on device s mod "
                         f"{stages} / stages_per_device).")


def format_orders(orders: Sequence[Sequence[Action]]) -> List[str]:
    """Each device's order as one line of actions, as `parse_orders` reads it.

    >>> format_orders(stage_orders("1f1b", stages=2, micro_batches=2))
    ['F0 F1 B0 B1', 'F0 B0 F1 B1']
    """
    return [" ".join(str(action) for action in order) for order in orders]


def parse_orders(lines: Sequence[str]) -> List[List[Action]]:
    """A user-given schedule: one line per device of actions ``F<k>`` /
    ``B<k>`` (``F<k>@<stage>`` where a device runs several stages)
    separated by spaces (what `format_orders` prints).

    >>> [[str(a) for a in order] for order in parse_orders(["F0 F1 B1 B0", "F0 B0 F1 B1"])]
    [['F0', 'F1', 'B1', 'B0'], ['F0', 'B0', 'F1', 'B1']]
    >>> parse_orders(["F0@2"])[0][0]
    Action(kind='F', micro_batch=0, stage=2)
    """
    if isinstance(lines, str):
        raise ValueError(f"a schedule's order is a list of lines, one per stage; got {lines!r}.")
    orders = []
    for device, line in enumerate(lines):
        if not isinstance(line, str):
            raise ValueError(f"stage {device}'s order must be a line such as 'F0 F1 B0 B1'; "
                             f"got {line!r}.")
        orders.append([_parsed(word, device, line) for word in line.split()])
    return orders


def _parsed(word: str, device: int, line: str) -> Action:
    kind, rest = word[:1], word[1:]
    number, at, stage = rest.partition("@")
    if kind not in (FORWARD, BACKWARD) or not number.isdigit() or (at and not stage.isdigit()):
        raise ValueError(f"stage {device}'s order: {word!r} is not an action (F<k> or "
                         f"B<k>, k a micro-batch; F<k>@<stage> where a device runs several "
                         f"stages); the line was {line!r}.")
    return Action(kind, int(number), int(stage) if at else None)


def orders_for(schedule, *, stages: int, micro_batches: int,
               stages_per_device: int = 1) -> List[List[Action]]:
    """The orders ``schedule`` gives: a name in `REGISTRY`, or a
    user-given order (one line per device, `parse_orders`), checked for
    ``stages`` and ``micro_batches`` and run on the unit-time model
    (`simulate`), so that an order that would wait forever is an error
    naming the stage and action, before anything is traced."""
    if isinstance(schedule, str):
        orders = stage_orders(schedule, stages=stages, micro_batches=micro_batches,
                              stages_per_device=stages_per_device)
    else:
        _check_sizes(stages, micro_batches, stages_per_device)
        orders = parse_orders(schedule)
        devices = stages // stages_per_device
        if len(orders) != devices:
            raise ValueError(
                f"the order gives {len(orders)} stage(s); the pipeline has {stages}"
                + ("." if stages_per_device == 1 else
                   f" on {devices} devices: one line per device."))
    simulate(orders, micro_batches=micro_batches, stages_per_device=stages_per_device)
    return orders


@dataclasses.dataclass
class Simulation:
    """The orders run with every action taking one time unit.

    Attributes:
      start: ``(device, action) -> time`` each action started at.
      steps: the time the last action ended at.
      grid: per device, what it ran at each time (``.`` idle).
      most_in_flight: per device, the most forward passes (through any of
        its stages) whose backward pass had not run yet: the activations
        it held (each 1/v of a stage's with v stages per device).
    """

    start: Dict[Tuple[int, Action], int]
    steps: int
    grid: List[str]
    most_in_flight: List[int]

    def idle(self) -> List[float]:
        """Each device's share of the step it waited."""
        busy = [sum(1 for device, _ in self.start if device == d) for d in range(len(self.grid))]
        return [1 - b / self.steps for b in busy]


def simulate(orders: Sequence[Sequence[Action]], micro_batches: Optional[int] = None,
             stages_per_device: int = 1) -> Simulation:
    """Runs ``orders`` (one list per device; with one stage per device,
    per stage) on the unit-time model. ``micro_batches``: how many each
    stage must run (default: as many as the first device's forward passes
    through its first stage). Stage s runs on device s mod p.

    Raises:
      ValueError: an order waits forever (it runs an action before one it
        depends on could run: the error names each device's waiting action
        and what it waits for), or misses or repeats an action.
    """
    devices = len(orders)
    stages = devices * stages_per_device
    if micro_batches is None:
        micro_batches = sum(a.kind == FORWARD and a.on_stage(0) == 0
                            for a in orders[0]) if orders else 0
    name = "stage" if stages_per_device == 1 else "device"
    for device, order in enumerate(orders):
        expected = sorted((kind, k, s) for kind in (FORWARD, BACKWARD)
                          for k in range(micro_batches) for s in range(device, stages, devices))
        if sorted((a.kind, a.micro_batch, a.on_stage(device)) for a in order) != expected:
            owned = "" if stages_per_device == 1 else (
                f" through each of its stages {list(range(device, stages, devices))}, each "
                "action naming its stage (F0@2)")
            raise ValueError(f"{name} {device} must run F and B of micro-batches "
                             f"0..{micro_batches - 1}{owned} once each; got "
                             f"{[str(a) for a in order]}")
    end: Dict[Tuple[int, Action], int] = {}  # ((stage, pass) -> time)
    start: Dict[Tuple[int, Action], int] = {}
    position = [0] * devices
    time = 0
    while any(position[d] < len(orders[d]) for d in range(devices)):
        ran = []
        for device in range(devices):
            if position[device] == len(orders[device]):
                continue
            action = orders[device][position[device]]
            if all(end.get(need, time + 1) <= time
                   for need in _needs(action.on_stage(device), action, stages)):
                ran.append((device, action))
        if not ran:
            raise ValueError(f"the schedule waits forever at time {time}: " + "; ".join(
                _waiting(orders, position, end, stages, stages_per_device)))
        for device, action in ran:
            start[(device, action)] = time
            end[(action.on_stage(device), action.pass_)] = time + 1
            position[device] += 1
        time += 1
    return Simulation(start, time, *_drawn(orders, start, time))


def _waiting(orders, position, end, stages: int, stages_per_device: int) -> List[str]:
    """What each device waits for, when none can go on."""
    devices, waiting = len(orders), []
    for device in range(devices):
        if position[device] == len(orders[device]):
            continue
        action = orders[device][position[device]]
        if stages_per_device == 1:
            needs = [f"{need} on stage {other}"
                     for other, need in _needs(device, action, stages) if (other, need) not in end]
            waiting.append(f"stage {device} at {action} (waits for {', '.join(needs)})")
        else:
            needs = [f"{Action(need.kind, need.micro_batch, other)} on device {other % devices}"
                     for other, need in _needs(action.on_stage(device), action, stages)
                     if (other, need) not in end]
            waiting.append(f"device {device} at {action} (waits for {', '.join(needs)})")
    return waiting


def _drawn(orders, start, time: int) -> Tuple[List[str], List[int]]:
    """Each device's grid line and the most activations it held."""
    width = max([2] + [len(str(action)) for order in orders for action in order])
    grid, most = [], []
    for device, order in enumerate(orders):
        cells, held, peak = ["." + " " * (width - 1)] * time, 0, 0
        for action in order:
            cells[start[(device, action)]] = f"{action}".ljust(width)
        for action in sorted(order, key=lambda a: start[(device, a)]):
            held += 1 if action.kind == FORWARD else -1
            peak = max(peak, held)
        grid.append(" ".join(cells).rstrip())
        most.append(peak)
    return grid, most


def _needs(stage: int, action: Action, stages: int) -> List[Tuple[int, Action]]:
    """The (stage, pass) an action through ``stage`` waits for."""
    k = action.micro_batch
    if action.kind == FORWARD:
        return [(stage - 1, Action(FORWARD, k))] if stage > 0 else []
    needs = [(stage, Action(FORWARD, k))]
    return needs + ([(stage + 1, Action(BACKWARD, k))] if stage < stages - 1 else [])


def bubble_fraction(stages: int, micro_batches: int, stages_per_device: int = 1) -> float:
    """The share of a step a device is idle when every action takes the
    same time: ``(p - 1) / (v·m + p - 1)`` for p = S / v devices, v
    stages per each (``(S - 1) / (m + S - 1)`` with one stage per device).

    >>> bubble_fraction(4, 8)
    0.2727272727272727
    >>> bubble_fraction(8, 8, stages_per_device=2)
    0.15789473684210525
    """
    devices = stages // stages_per_device
    return (devices - 1) / (stages_per_device * micro_batches + devices - 1)
