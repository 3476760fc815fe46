"""`tfdist.loops.agreement.StopAgreement`: when workers agree on a stop request.

The all-reduce is the same under any strategy (a sum over replicas), so the
schedule is tested here on MirroredStrategy(2) in one process; the
multi-worker behaviour (SIGTERM to one worker stops every worker at one
step) is tested with real processes in tests/scenarios/test_reliability.py.
"""

import time

from tfdist.loops.agreement import StopAgreement


def _agreement(make_strategy, target_seconds):
    return StopAgreement(make_strategy(2), spans_workers=True, target_seconds=target_seconds)


def test_without_workers_a_request_is_seen_at_once(make_strategy):
    agreement = StopAgreement(make_strategy(2), spans_workers=False)
    assert agreement.after_execution(False) is False
    assert agreement.after_execution(True) is True
    assert agreement.agreements == 0


def test_fast_executions_agree_about_once_per_target_seconds(make_strategy):
    agreement = _agreement(make_strategy, target_seconds=0.2)
    assert agreement.after_execution(False) is False  # the first execution agrees
    assert agreement.agreements == 1
    assert agreement.interval <= 2  # grows at most 2x per agreement
    # Executions of ~2 ms: the next interval is about 0.2 s of them.
    agreed_at = []
    for execution in range(400):
        time.sleep(0.002)
        before = agreement.agreements
        agreement.after_execution(False)
        if agreement.agreements > before:
            agreed_at.append(execution)
    assert agreement.interval > 10, agreement.interval
    # 1, 2, 4, ... then about 100 executions per 0.2 s: far fewer than 400.
    assert 3 <= len(agreed_at) < 30, agreed_at


def test_a_request_between_agreements_is_seen_at_the_next_one(make_strategy):
    agreement = _agreement(make_strategy, target_seconds=0.05)
    for _ in range(20):  # ~10 ms executions: the interval settles near 5
        time.sleep(0.01)
        agreement.after_execution(False)
    while agreement._since:  # pylint: disable=protected-access
        agreement.after_execution(False)  # up to the next agreement point
    interval = agreement.interval
    assert interval > 1
    seen = []
    for _ in range(interval):
        seen.append(agreement.after_execution(True))
    assert seen[-1] is True and not any(seen[:-1]), (interval, seen)


def test_the_last_execution_agrees_at_once(make_strategy):
    agreement = _agreement(make_strategy, target_seconds=60.0)
    time.sleep(0.01)
    agreement.after_execution(False)
    assert agreement.interval == 2
    assert agreement.after_execution(True) is False  # mid-interval: not yet
    assert agreement.after_execution(True, last=True) is True
