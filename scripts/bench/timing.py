"""Alternating, paired timing on a noisy machine.

Machine noise (other processes, CPU frequency, a neighbour VM) comes in
spells of seconds, so contenders are timed in windows of several seconds
and in alternation within a round; the round's order rotates, so no
contender always goes first (or right after the same one). The figure that
counts is the PAIRED ratio: a contender's rate over the reference's rate in
the same round, which cancels the noise both saw. Its median over rounds,
its quartiles, and the medians of the first and second half of the rounds
(if those two differ much, the run was too short to trust) are reported.
"""

import statistics
import time
from typing import Callable, Dict, List, Sequence


def order_of_round(names: Sequence[str], round_index: int) -> List[str]:
    """``names`` rotated by ``round_index``: each contender leads in turn."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def alternate(runners: Dict[str, Callable[[int], None]], rounds: int, steps: int,
              examples_per_step: int, progress: Callable[[str], None] = print
              ) -> Dict[str, List[float]]:
    """Runs every contender for ``steps`` steps per round; returns each one's
    examples/s per round (index = round), so rounds can be paired."""
    rates = {name: [] for name in runners}
    for round_index in range(rounds):
        for name in order_of_round(list(runners), round_index):
            start = time.perf_counter()
            runners[name](steps)
            rates[name].append(steps * examples_per_step / (time.perf_counter() - start))
        progress(f"round {round_index + 1}/{rounds}: " + ", ".join(
            f"{name} {values[-1]:,.0f}" for name, values in rates.items()) + " ex/s")
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


def paired_ratios(rates: Dict[str, List[float]], reference: str) -> Dict[str, dict]:
    """``summary`` of rate / reference rate, round by round, per contender."""
    if reference not in rates:
        return {}
    return {
        name: summary([a / b for a, b in zip(values, rates[reference])])
        for name, values in rates.items()
        if name != reference and len(values) == len(rates[reference])
    }
