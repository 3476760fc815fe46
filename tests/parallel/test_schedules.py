"""`tfdist.parallel.schedules` against the formulas it implements: GPipe,
1F1B (Megatron-LM's warm-up of S - 1 - s forwards) and interleaved 1F1B
(Megatron-LM's virtual stages: the bubble (p - 1) / (v·m + p - 1)), run
on the unit-time model."""

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
    assert schedules.SCHEDULES == tuple(schedules.REGISTRY) == (
        "gpipe", "1f1b", "interleaved_1f1b")
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


# (p devices, v stages per device, m micro-batches)
INTERLEAVED = [(2, 2, 2), (2, 2, 4), (2, 3, 6), (3, 2, 6), (4, 2, 4), (4, 2, 8), (4, 4, 8),
               (4, 2, 12)]


@pytest.mark.parametrize("devices,per_device,micro_batches", INTERLEAVED)
def test_interleaved_1f1b_runs_every_stages_passes_on_its_device_with_the_smaller_bubble(
        devices, per_device, micro_batches):
    stages = devices * per_device
    orders = schedules.stage_orders("interleaved_1f1b", stages=stages,
                                    micro_batches=micro_batches, stages_per_device=per_device)
    assert len(orders) == devices
    for device, order in enumerate(orders):
        assert {action.stage for action in order} == set(range(device, stages, devices))
    simulation = schedules.simulate(orders, micro_batches, stages_per_device=per_device)
    # 2 m v actions per device, 2 (p - 1) to fill and drain (Narayanan et al. 2021, eq. 2)
    assert simulation.steps == 2 * micro_batches * per_device + 2 * (devices - 1)
    expected = (devices - 1) / (per_device * micro_batches + devices - 1)
    assert simulation.idle() == pytest.approx([expected] * devices)
    assert schedules.bubble_fraction(stages, micro_batches, per_device) == pytest.approx(expected)
    # the same model on p devices with one long stage each idles more
    one_stage_each = schedules.simulate(schedules.stage_orders(
        "1f1b", stages=devices, micro_batches=micro_batches))
    assert one_stage_each.idle()[0] > simulation.idle()[0]


def test_interleaved_1f1b_is_megatrons_order_written_out_by_hand():
    # p = 2, v = 2, m = 4: device 0 holds stages 0 and 2, device 1 stages 1
    # and 3. Device 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards,
    # device 1 with 2; micro-batches go p = 2 at a time through each stage.
    lines = schedules.format_orders(schedules.stage_orders(
        "interleaved_1f1b", stages=4, micro_batches=4, stages_per_device=2))
    assert lines == [
        "F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0",
        "F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1"]
    assert schedules.parse_orders(lines) == schedules.stage_orders(
        "interleaved_1f1b", stages=4, micro_batches=4, stages_per_device=2)
    # one stage per device: the same as 1f1b
    assert schedules.stage_orders("interleaved_1f1b", stages=3, micro_batches=4) == \
        schedules.stage_orders("1f1b", stages=3, micro_batches=4)


def test_stages_on_devices_that_cannot_be_run_are_refused_naming_why():
    with pytest.raises(ValueError, match=r"micro_batches \(3\) must be a multiple of the 2 "
                                         r"devices"):
        schedules.stage_orders("interleaved_1f1b", stages=4, micro_batches=3,
                               stages_per_device=2)
    with pytest.raises(ValueError, match=r"'1f1b' runs one stage per device; with "
                                         r"stages_per_device=2 use 'interleaved_1f1b'"):
        schedules.stage_orders("1f1b", stages=4, micro_batches=2, stages_per_device=2)
    with pytest.raises(ValueError, match=r"stages_per_device \(2\) must divide the 3 stages"):
        schedules.orders_for("interleaved_1f1b", stages=3, micro_batches=2,
                             stages_per_device=2)
    # a user's order for 4 stages on 2 devices: one line per device, each
    # action naming its stage; the stage must be the device's
    with pytest.raises(ValueError, match=r"4 on 2 devices: one line per device"):
        schedules.orders_for(["F0@0 B0@0"] * 4, stages=4, micro_batches=1,
                             stages_per_device=2)
    with pytest.raises(ValueError, match=r"device 0 must run F and B of micro-batches 0..0 "
                                         r"through each of its stages \[0, 2\]"):
        schedules.orders_for(["F0@0 F0@1 B0@1 B0@0", "F0@1 F0@3 B0@3 B0@1"], stages=4,
                             micro_batches=1, stages_per_device=2)
    # device 0 runs stage 2's forward before stage 1 (device 1) ran it,
    # and device 1 waits for stage 2's backward first: a deadlock named
    deadlock = ["F0@0 F0@2 B0@2 B0@0", "B0@3 F0@1 F0@3 B0@1"]
    with pytest.raises(ValueError, match=r"waits forever at time 1: device 0 at F0@2 \(waits "
                                         r"for F0@1 on device 1\); device 1 at B0@3 \(waits "
                                         r"for F0@3 on device 1\)"):
        schedules.orders_for(deadlock, stages=4, micro_batches=1, stages_per_device=2)
    with pytest.raises(ValueError, match=r"'F0@x' is not an action"):
        schedules.parse_orders(["F0@x"])
