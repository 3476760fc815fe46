"""`tfdist.launch.decisions.decide`: every transition of the launcher after a
start of its group, and the order in which the checks win, from facts
alone (no processes). The launcher itself, on real processes:
tests/launch/test_launcher.py and tests/scenarios/."""

import dataclasses

import pytest

from tfdist.launch import GroupResult
from tfdist.launch.decisions import PORT_RETRIES, Action, Decision, Facts, decide

# A failed start of 3 workers (floor 2) with one restart left.
FAILED = Facts(workers=3, fewest_workers=2, restarts=0, max_restarts=1)


def _after(facts=FAILED, **changes):
    return decide(dataclasses.replace(facts, **changes))


# One test per transition.

def test_a_successful_run_is_finished():
    assert _after(ok=True, finished=True) == Decision(Action.FINISHED, 3)


def test_a_signal_stops_the_launcher():
    assert _after(stopped=True, signal_seen=True) == Decision(Action.STOPPED, 3)


def test_host_discovery_re_forms_the_group_at_its_size():
    assert _after(stopped=True, resize_requested=True, resize_to=2) == Decision(Action.RESIZE, 2)


def test_a_taken_port_starts_again_on_new_ports():
    assert _after(port_conflict=True) == Decision(Action.NEW_PORTS, 3)


def test_a_failure_with_restarts_left_restarts_at_the_same_size():
    assert _after() == Decision(Action.RESTART, 3)


def test_a_worker_lost_before_joining_restarts_with_one_fewer():
    assert _after(restarts=1, max_restarts=2, lost_worker="worker-2") == Decision(
        Action.RESTART_SMALLER, 2)


def test_a_failure_without_restarts_left_gives_up():
    assert _after(restarts=1) == Decision(Action.GIVE_UP, 3)
    assert _after(max_restarts=0) == Decision(Action.GIVE_UP, 3)  # the default: no restarts


def test_which_actions_end_the_launch_and_which_count_as_restarts():
    assert {a for a in Action if a.ends} == {Action.FINISHED, Action.STOPPED, Action.GIVE_UP}
    assert {a for a in Action if a.is_restart} == {Action.RESTART, Action.RESTART_SMALLER}


# Which check wins when several hold.

def test_a_signal_wins_over_a_resize_requested_at_the_same_time():
    facts = dataclasses.replace(FAILED, stopped=True, resize_requested=True, resize_to=2)
    assert decide(facts).action is Action.RESIZE
    assert _after(facts, signal_seen=True) == Decision(Action.STOPPED, 3)


def test_a_resize_asked_once_every_worker_finished_is_success():
    """The stop was the launcher's own and no signal came: the run is done."""
    assert _after(stopped=True, finished=True, resize_requested=True, resize_to=2) == Decision(
        Action.FINISHED, 3)


def test_success_wins_over_a_signal_that_came_after_it():
    assert _after(ok=True, finished=True, signal_seen=True).action is Action.FINISHED


def test_a_signal_after_a_failure_stops_rather_than_restarts():
    assert _after(signal_seen=True, port_conflict=True, lost_worker="worker-2").action is (
        Action.STOPPED)


def test_a_taken_port_is_retried_even_when_restarts_are_exhausted():
    exhausted = dataclasses.replace(FAILED, restarts=1, max_restarts=1, port_conflict=True)
    assert decide(exhausted) == Decision(Action.NEW_PORTS, 3)
    assert _after(exhausted, port_retries=PORT_RETRIES).action is Action.GIVE_UP
    assert _after(exhausted, fixed_ports=True).action is Action.GIVE_UP  # --ports: no new ones


def test_port_retries_run_out_then_restarts_count():
    assert _after(port_conflict=True, port_retries=PORT_RETRIES - 1).action is Action.NEW_PORTS
    assert _after(port_conflict=True, port_retries=PORT_RETRIES).action is Action.RESTART


def test_a_lost_worker_at_the_minimum_size_restarts_at_that_size():
    assert _after(workers=2, restarts=1, max_restarts=2, lost_worker="worker-1") == Decision(
        Action.RESTART, 2)


def test_a_lost_worker_with_no_restarts_left_gives_up():
    assert _after(restarts=1, lost_worker="worker-2").action is Action.GIVE_UP


@pytest.mark.parametrize("lost, discovered, decision", [
    (None, 4, Decision(Action.RESTART, 4)),  # capacity came back: grow
    (None, 2, Decision(Action.RESTART, 2)),
    (None, None, Decision(Action.RESTART, 3)),  # the script failed: keep the size
    ("worker-2", 3, Decision(Action.RESTART_SMALLER, 3)),  # discovery's answer wins
    ("worker-2", None, Decision(Action.RESTART_SMALLER, 2)),
])
def test_discovery_sets_the_size_of_a_restart(lost, discovered, decision):
    assert _after(restarts=1, max_restarts=2, lost_worker=lost, discovered=discovered) == decision


def test_discovery_does_not_change_a_start_that_is_not_a_restart():
    assert _after(ok=True, discovered=4) == Decision(Action.FINISHED, 3)
    assert _after(port_conflict=True, discovered=4) == Decision(Action.NEW_PORTS, 3)
    assert _after(restarts=1, discovered=4) == Decision(Action.GIVE_UP, 3)


# The records are values.

def test_the_records_can_not_be_changed():
    result = GroupResult(1, "worker-1", "exited", ["boom"])
    for name, value in [("exit_code", 0), ("stopped_by", "SIGINT"), ("exit_codes", {})]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, name, value)
    closed = dataclasses.replace(result, exit_codes={"worker-0": 143, "worker-1": 1})
    assert (result.exit_codes, closed.codes()) == ({}, "worker-0=143, worker-1=1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        FAILED.restarts = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        decide(FAILED).workers = 2
