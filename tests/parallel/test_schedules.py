"""`tfdist.parallel.schedules` against the formulas it implements: GPipe
and 1F1B (Megatron-LM's warm-up of S - 1 - s forwards), run on the
unit-time model."""

import pytest

from tfdist.parallel import schedules

SIZES = [(1, 1), (2, 1), (2, 4), (3, 2), (3, 4), (4, 8), (4, 3)]


@pytest.mark.parametrize("schedule", schedules.SCHEDULES)
@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_every_stage_runs_each_pass_once_and_the_step_takes_the_pipelines_time(
        schedule, stages, micro_batches):
    simulation = schedules.simulate(
        schedules.stage_orders(schedule, stages=stages, micro_batches=micro_batches))
    # m forwards and m backwards per stage, S - 1 steps to fill and S - 1 to drain.
    assert simulation.steps == 2 * (micro_batches + stages - 1)
    idle = [1 - 2 * micro_batches / simulation.steps for _ in range(stages)]
    assert idle == pytest.approx([schedules.bubble_fraction(stages, micro_batches)] * stages)


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_1f1b_holds_at_most_s_minus_stage_micro_batches_and_gpipe_all(stages, micro_batches):
    one_f_one_b = schedules.simulate(
        schedules.stage_orders("1f1b", stages=stages, micro_batches=micro_batches))
    gpipe = schedules.simulate(
        schedules.stage_orders("gpipe", stages=stages, micro_batches=micro_batches))
    assert one_f_one_b.most_in_flight == [min(stages - s, micro_batches) for s in range(stages)]
    assert gpipe.most_in_flight == [micro_batches] * stages


def test_1f1b_warms_up_with_megatrons_count_then_alternates():
    orders = schedules.stage_orders("1f1b", stages=4, micro_batches=6)
    for stage, order in enumerate(orders):
        warmup = min(4 - 1 - stage, 6)
        text = [str(action) for action in order]
        assert text[:warmup] == [f"F{k}" for k in range(warmup)]
        steady = text[warmup:warmup + 2 * (6 - warmup)]
        assert steady == [x for k in range(6 - warmup) for x in (f"F{warmup + k}", f"B{k}")]
        assert text[len(text) - warmup:] == [f"B{k}" for k in range(6 - warmup, 6)]


def test_an_order_that_waits_forever_or_misses_a_pass_is_an_error():
    B, F = schedules.BACKWARD, schedules.FORWARD
    waits = [[schedules.Action(B, 0), schedules.Action(F, 0)],
             [schedules.Action(F, 0), schedules.Action(B, 0)]]
    with pytest.raises(ValueError, match="waits forever at time 0"):
        schedules.simulate(waits)
    with pytest.raises(ValueError, match="stage 1 must run F and B"):
        schedules.simulate([[schedules.Action(F, 0), schedules.Action(B, 0)],
                            [schedules.Action(F, 0)]])
    with pytest.raises(ValueError, match="schedule must be one of"):
        schedules.stage_orders("zero_bubble", stages=2, micro_batches=2)


def test_the_named_schedules_are_a_registry_and_print_and_parse_back():
    assert schedules.SCHEDULES == tuple(schedules.REGISTRY) == ("gpipe", "1f1b")
    for name in schedules.SCHEDULES:
        orders = schedules.stage_orders(name, stages=3, micro_batches=4)
        lines = schedules.format_orders(orders)
        assert schedules.parse_orders(lines) == orders
        assert schedules.orders_for(lines, stages=3, micro_batches=4) == orders
    assert schedules.format_orders(schedules.stage_orders("gpipe", stages=2, micro_batches=2)) \
        == ["F0 F1 B1 B0", "F0 F1 B1 B0"]


def test_a_users_order_is_checked_naming_the_stage_and_the_action():
    # Stage 1 wants F1 first, which stage 0 runs only after its B0, which
    # needs stage 1's B0: each waits for the other.
    deadlock = ["F0 B0 F1 B1", "F1 F0 B0 B1"]
    with pytest.raises(ValueError, match=r"waits forever at time 1: stage 0 at B0 \(waits for "
                                         r"B0 on stage 1\); stage 1 at F1 \(waits for F1 on "
                                         r"stage 0\)"):
        schedules.orders_for(deadlock, stages=2, micro_batches=2)
    with pytest.raises(ValueError, match=r"stage 1's order: 'X0' is not an action"):
        schedules.parse_orders(["F0 B0", "X0 B0"])
    with pytest.raises(ValueError, match=r"a list of lines, one per stage"):
        schedules.parse_orders("F0 B0")
    with pytest.raises(ValueError, match=r"gives 1 stage\(s\); the pipeline has 2"):
        schedules.orders_for(["F0 B0"], stages=2, micro_batches=1)
    with pytest.raises(ValueError, match=r"stage 0 must run F and B of micro-batches 0..1"):
        schedules.orders_for(["F0 B0", "F0 B0"], stages=2, micro_batches=2)
