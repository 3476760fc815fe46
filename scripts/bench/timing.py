"""Alternating, paired timing on a noisy machine.

This machine's speed comes in bands that switch every few seconds (the same
loop measured at 26k, 52k and 100k examples/s in consecutive windows: a
shared VM's cores come and go). So contenders are timed in windows of a
second or two, and every window of a contender sits between two windows
of the reference (R a R b R c R, the order of a, b, c rotating by round):
the figure that counts is the PAIRED ratio of a window's rate to each of
its neighbouring reference windows, which cancels whatever band both saw.
Reported per contender: the median of those ratios, their quartiles, and
the medians of the first and second half of the run (if these two differ
much, the run was too short to trust).
"""

import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

Timeline = List[Tuple[str, float]]  # (contender, examples/s), in run order


def order_of_round(names: Sequence[str], round_index: int) -> List[str]:
    """``names`` rotated by ``round_index``: each contender leads in turn."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def schedule(names: Sequence[str], reference: Optional[str], round_index: int) -> List[str]:
    """One round: every other contender once, each between two windows of
    ``reference`` (when it runs); the others' order rotates by round."""
    others = order_of_round([name for name in names if name != reference], round_index)
    if reference not in names:
        return others
    sequence = [reference]
    for name in others:
        sequence += [name, reference]
    return sequence


def alternate(runners: Dict[str, Callable[[int], None]], rounds: int, steps: int,
              examples_per_step: int, reference: Optional[str] = None,
              progress: Callable[[str], None] = print) -> Timeline:
    """Runs ``rounds`` rounds of `schedule`, each window ``steps`` steps;
    returns every window's (contender, examples/s) in run order."""
    timeline: Timeline = []
    for round_index in range(rounds):
        this_round = []
        for name in schedule(list(runners), reference, round_index):
            start = time.perf_counter()
            runners[name](steps)
            this_round.append((name, steps * examples_per_step / (time.perf_counter() - start)))
        timeline += this_round
        progress(f"round {round_index + 1}/{rounds}: " + ", ".join(
            f"{name} {rate:,.0f}" for name, rate in this_round) + " ex/s")
    return timeline


def rates_by_name(timeline: Timeline) -> Dict[str, List[float]]:
    """Each contender's rates, in run order."""
    rates: Dict[str, List[float]] = {}
    for name, rate in timeline:
        rates.setdefault(name, []).append(rate)
    return rates


def window_steps(seconds_per_step: float, window_seconds: float, steps_per_execution: int,
                 minimum_executions: int = 2) -> int:
    """Steps that take about ``window_seconds``, a whole number of executions."""
    executions = max(minimum_executions,
                     round(window_seconds / max(seconds_per_step, 1e-9) / steps_per_execution))
    return executions * steps_per_execution


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated ``q`` quantile of ``values`` (0 <= q <= 1)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> dict:
    """Median, quartiles, extremes, and the medians of each half."""
    half = len(values) // 2
    return {
        "median": statistics.median(values),
        "p25": quantile(values, 0.25),
        "p75": quantile(values, 0.75),
        "min": min(values),
        "max": max(values),
        "first_half_median": statistics.median(values[:half]) if half else values[0],
        "second_half_median": statistics.median(values[half:]),
        "n": len(values),
    }


def _normalized(timeline: Timeline, reference: str) -> Dict[str, List[List[float]]]:
    """Per contender, per window: its rate over each neighbouring reference
    window's rate (one or two ratios)."""
    ratios: Dict[str, List[List[float]]] = {}
    for index, (name, rate) in enumerate(timeline):
        if name == reference:
            continue
        neighbours = [timeline[j][1] for j in (index - 1, index + 1)
                      if 0 <= j < len(timeline) and timeline[j][0] == reference]
        if neighbours:
            ratios.setdefault(name, []).append([rate / other for other in neighbours])
    return ratios


def paired_ratios(timeline: Timeline, reference: str) -> Dict[str, dict]:
    """`summary` of every contender's window-to-neighbouring-reference ratios."""
    return {name: summary([r for window in windows for r in window])
            for name, windows in _normalized(timeline, reference).items()}


def ratios_between(timeline: Timeline, reference: str, baseline: str) -> Dict[str, dict]:
    """`summary` of each contender's rate over ``baseline``'s, round by round,
    both first normalized by their neighbouring ``reference`` windows (so a
    speed band shared by neither pair is cancelled too)."""
    normalized = {name: [statistics.mean(window) for window in windows]
                  for name, windows in _normalized(timeline, reference).items()}
    if baseline not in normalized:
        return {}
    return {name: summary([a / b for a, b in zip(values, normalized[baseline])])
            for name, values in normalized.items()
            if name != baseline and len(values) == len(normalized[baseline])}
