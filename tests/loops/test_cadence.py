"""tfdist.loops.cadence on its own: execution sizes, log and save points, epoch ends."""

import pytest

from tfdist.loops.cadence import Cadence


def _executions(cadence, step=0, step_in_epoch=0, limit=100):
    """Replays a fixed-length epoch: (size, log point?, save point?) per execution."""
    seen = []
    while not cadence.epoch_done(step_in_epoch) and len(seen) < limit:
        size = cadence.next_execution(step, step_in_epoch)
        assert size >= 1
        seen.append((
            size,
            cadence.is_log_point(step_in_epoch, step_in_epoch + size),
            cadence.is_save_point(step, step + size),
        ))
        step, step_in_epoch = step + size, step_in_epoch + size
    return seen


def test_steps_per_execution_that_does_not_divide_the_epoch():
    cadence = Cadence(steps_per_execution=4, log_every_steps=100, steps_per_epoch=10)
    assert [size for size, _, _ in _executions(cadence)] == [4, 4, 2]


def test_executions_stop_at_save_points():
    cadence = Cadence(steps_per_execution=4, log_every_steps=100,
                      checkpoint_every_steps=3, steps_per_epoch=10)
    assert _executions(cadence) == [
        (3, False, True), (3, False, True), (3, False, True), (1, False, False),
    ]


def test_save_points_count_steps_of_the_run_not_of_the_epoch():
    # Second epoch of 10 steps: the run is at step 10; saves every 4 -> 12, 16, 20.
    cadence = Cadence(steps_per_execution=8, log_every_steps=100,
                      checkpoint_every_steps=4, steps_per_epoch=10)
    assert [s for s, _, _ in _executions(cadence, step=10)] == [2, 4, 4]
    assert all(save for _, _, save in _executions(cadence, step=10))


def test_log_points_when_an_execution_reaches_or_crosses_one():
    cadence = Cadence(steps_per_execution=3, log_every_steps=5, steps_per_epoch=12)
    # 0->3, 3->6 (crosses 5), 6->9, 9->12 (crosses 10)
    assert [log for _, log, _ in _executions(cadence)] == [False, True, False, True]


def test_executions_longer_than_the_log_interval_log_every_time():
    cadence = Cadence(steps_per_execution=10, log_every_steps=3, steps_per_epoch=25)
    assert _executions(cadence) == [(10, True, False), (10, True, False), (5, True, False)]


def test_resume_mid_epoch_keeps_the_uninterrupted_points():
    """Resumed at step 7 of a 10-step epoch (run step 17): the remaining log
    and save points are those an uninterrupted run would reach."""
    cadence = Cadence(steps_per_execution=2, log_every_steps=4,
                      checkpoint_every_steps=5, steps_per_epoch=10)
    assert _executions(cadence, step=17, step_in_epoch=7) == [
        (2, True, False),   # 7 -> 9 (log point 8); run 17 -> 19
        (1, False, True),   # 9 -> 10; run 19 -> 20 (save point)
    ]


def test_an_execution_that_ran_no_steps_is_no_log_or_save_point():
    cadence = Cadence(steps_per_execution=4, log_every_steps=4, checkpoint_every_steps=4)
    assert not cadence.is_log_point(8, 8)
    assert not cadence.is_save_point(8, 8)


def test_epochs_of_unknown_length_never_end_by_count():
    cadence = Cadence(steps_per_execution=4, log_every_steps=10)
    assert not cadence.epoch_done(10**9)
    assert cadence.next_execution(step=0, step_in_epoch=10**9) == 4


@pytest.mark.parametrize("spe", [1, 3, 7, 16])
def test_every_step_of_the_epoch_runs_exactly_once(spe):
    cadence = Cadence(steps_per_execution=spe, log_every_steps=5,
                      checkpoint_every_steps=6, steps_per_epoch=23)
    assert sum(size for size, _, _ in _executions(cadence, step=4)) == 23


@pytest.mark.parametrize("spe", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("checkpoint_every_steps", [None, 6, 50])
@pytest.mark.parametrize("start", [(0, 0), (4, 4), (17, 7), (99, 9)])
def test_quiet_executions_are_the_full_size_executions_before_any_point(
        spe, checkpoint_every_steps, start):
    """Against a replay with `next_execution` / `is_log_point` /
    `is_save_point`: from every position of an epoch, the quiet count is
    how many executions in a row are full size and reach no log point,
    no save point and not the epoch's end."""
    step, step_in_epoch = start
    cadence = Cadence(steps_per_execution=spe, log_every_steps=5,
                      checkpoint_every_steps=checkpoint_every_steps, steps_per_epoch=23)
    while not cadence.epoch_done(step_in_epoch):
        expected, s, e = 0, step, step_in_epoch
        for size, log, save in _executions(cadence, s, e):
            if size < spe or log or save or e + size >= 23:
                break
            expected, s, e = expected + 1, s + size, e + size
        assert cadence.quiet_executions(step, step_in_epoch) == expected, (step, step_in_epoch)
        size = cadence.next_execution(step, step_in_epoch)
        step, step_in_epoch = step + size, step_in_epoch + size


def test_quiet_executions_in_epochs_of_unknown_length_stop_before_log_points():
    cadence = Cadence(steps_per_execution=4, log_every_steps=10)
    assert cadence.quiet_executions(step=0, step_in_epoch=0) == 2  # 0-4, 4-8; 8-12 logs
    assert cadence.quiet_executions(step=8, step_in_epoch=8) == 0
    assert cadence.quiet_executions(step=12, step_in_epoch=12) == 1  # 12-16; 16-20 logs
