"""scripts/bench/timing.py: rotation, windows and paired ratios (no TensorFlow)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))

from bench import timing  # noqa: E402


def test_every_contender_leads_one_round_in_turn():
    names = ["a", "b", "c"]
    orders = [timing.order_of_round(names, index) for index in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert timing.order_of_round(names, 4) == orders[1]


def test_every_window_sits_between_two_reference_windows():
    names = ["tfdist", "keras_fit", "custom_loop"]
    assert timing.schedule(names, "custom_loop", 0) == [
        "custom_loop", "tfdist", "custom_loop", "keras_fit", "custom_loop"]
    assert timing.schedule(names, "custom_loop", 1) == [
        "custom_loop", "keras_fit", "custom_loop", "tfdist", "custom_loop"]
    # Without the reference (it failed to build): the others, rotating.
    assert timing.schedule(["tfdist", "keras_fit"], "custom_loop", 1) == ["keras_fit", "tfdist"]


def test_alternate_runs_the_schedule_and_records_every_window():
    calls = []
    runners = {name: (lambda steps, name=name: calls.append((name, steps)))
               for name in ("tfdist", "custom_loop")}
    timeline = timing.alternate(runners, rounds=2, steps=5, examples_per_step=10,
                                reference="custom_loop", progress=lambda line: None)
    assert [name for name, _ in calls] == ["custom_loop", "tfdist", "custom_loop"] * 2
    assert all(steps == 5 for _, steps in calls)
    assert [name for name, _ in timeline] == [name for name, _ in calls]
    assert {k: len(v) for k, v in timing.rates_by_name(timeline).items()} == {
        "tfdist": 2, "custom_loop": 4}


def test_paired_ratios_cancel_a_speed_band_shared_with_the_neighbours():
    # The machine is twice as slow around tfdist's second window: the
    # neighbouring reference windows saw it too, so the ratio stays 0.98.
    timeline = [("custom_loop", 100.0), ("tfdist", 98.0), ("custom_loop", 100.0),
                ("custom_loop", 50.0), ("tfdist", 49.0), ("custom_loop", 50.0)]
    ratios = timing.paired_ratios(timeline, "custom_loop")
    assert set(ratios) == {"tfdist"}
    assert ratios["tfdist"]["n"] == 4
    assert ratios["tfdist"]["median"] == pytest.approx(0.98)
    assert ratios["tfdist"]["first_half_median"] == pytest.approx(0.98)
    assert ratios["tfdist"]["second_half_median"] == pytest.approx(0.98)
    # A band switch between the two neighbours: one ratio each way, median holds.
    switched = [("custom_loop", 100.0), ("tfdist", 98.0), ("custom_loop", 50.0),
                ("custom_loop", 100.0), ("tfdist", 97.0), ("custom_loop", 100.0),
                ("custom_loop", 100.0), ("tfdist", 99.0), ("custom_loop", 100.0)]
    # ratios 0.98, 1.96 | 0.97, 0.97 | 0.99, 0.99: the outlier does not move the median
    assert timing.paired_ratios(switched, "custom_loop")["tfdist"]["median"] == pytest.approx(0.985)


def test_ratios_between_two_contenders_go_through_their_own_references():
    timeline = [("custom_loop", 100.0), ("tfdist", 120.0), ("custom_loop", 100.0),
                ("keras_fit", 40.0), ("custom_loop", 50.0)]  # keras ran in a slow band
    vs_keras = timing.ratios_between(timeline, "custom_loop", "keras_fit")
    assert vs_keras["tfdist"]["median"] == pytest.approx(1.2 / ((0.4 + 0.8) / 2))
    assert timing.ratios_between(timeline, "custom_loop", "tfdist_attach") == {}


def test_window_is_whole_executions_of_about_the_asked_time():
    assert timing.window_steps(0.001, 2.0, 16) == 2000
    assert timing.window_steps(0.001, 2.0, 1) == 2000
    assert timing.window_steps(0.5, 2.0, 16) == 32  # at least two executions
    assert timing.quantile([1, 2, 3, 4, 5], 0.25) == 2
    assert timing.quantile([1.0, 2.0], 0.5) == 1.5
