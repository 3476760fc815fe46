"""scripts/bench/timing.py: rotation, windows and paired ratios (no TensorFlow)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))

from bench import timing  # noqa: E402


def test_every_contender_leads_one_round_in_turn():
    names = ["a", "b", "c"]
    orders = [timing.order_of_round(names, index) for index in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert timing.order_of_round(names, 4) == orders[1]


def test_alternate_pairs_rates_by_round_and_rotates_the_order():
    calls = []
    runners = {name: (lambda steps, name=name: calls.append((name, steps)))
               for name in ("tfdist", "custom_loop")}
    rates = timing.alternate(runners, rounds=3, steps=5, examples_per_step=10,
                             progress=lambda line: None)
    assert [name for name, _ in calls] == ["tfdist", "custom_loop", "custom_loop", "tfdist",
                                           "tfdist", "custom_loop"]
    assert all(steps == 5 for _, steps in calls)
    assert {name: len(values) for name, values in rates.items()} == {"tfdist": 3, "custom_loop": 3}


def test_paired_ratios_divide_within_each_round():
    # The machine got twice as slow in round 2 for both: the pair cancels it.
    rates = {"custom_loop": [100.0, 50.0, 100.0, 100.0], "tfdist": [98.0, 49.0, 96.0, 99.0]}
    ratios = timing.paired_ratios(rates, "custom_loop")
    assert set(ratios) == {"tfdist"}
    assert ratios["tfdist"]["median"] == pytest.approx(0.98)
    assert ratios["tfdist"]["min"] == pytest.approx(0.96)
    assert ratios["tfdist"]["first_half_median"] == pytest.approx(0.98)
    assert ratios["tfdist"]["second_half_median"] == pytest.approx(0.975)
    assert timing.paired_ratios(rates, "keras_fit") == {}


def test_window_is_whole_executions_of_about_the_asked_time():
    assert timing.window_steps(0.001, 2.0, 16) == 2000
    assert timing.window_steps(0.001, 2.0, 1) == 2000
    assert timing.window_steps(0.5, 2.0, 16) == 32  # at least two executions
    assert timing.quantile([1, 2, 3, 4, 5], 0.25) == 2
    assert timing.quantile([1.0, 2.0], 0.5) == 1.5
