"""One public way for each job (issue 34 point 2): each deprecated name warns
with a DeprecationWarning that names its replacement and still does what it
did, by delegating to the kept way; the kept ways do not warn; tfdist's own
code, example programs and docs call only the kept ways; and the two Slurm
entry points give the same addresses.

All cheap: no cluster, no TPU; the few TensorFlow calls are eager or one
small traced loop on one device.
"""

import json
import pathlib
import re
import signal
import threading
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import cluster
from tfdist.launch import slurm_task
from tfdist.loops import host_loop, preemption
from tfdist.loops.runners import device_loop
from tfdist.replica import losses

REPO = pathlib.Path(__file__).resolve().parents[1]


def _deprecations(record):
    """tfdist's DeprecationWarnings among ``record`` (not TensorFlow's own)."""
    return [w for w in record
            if issubclass(w.category, DeprecationWarning) and "tfdist" in str(w.message)]


# -- 1. scaled_loss -> replica_loss -------------------------------------------


def test_scaled_loss_warns_naming_replica_loss():
    with pytest.warns(DeprecationWarning, match=r"scaled_loss is deprecated; use "
                                                r"tfdist\.replica\.losses\.replica_loss"):
        losses.scaled_loss(tf.constant([1.0, 3.0]), global_count=4)


def test_scaled_loss_still_computes_the_weighted_sum_over_the_global_count():
    values = tf.constant([[1.0, 2.0], [3.0, 4.0]])  # 2 examples x 2 loss elements
    weights = tf.constant([1.0, 0.5])
    with pytest.warns(DeprecationWarning):
        loss = losses.scaled_loss(values, sample_weight=weights, global_count=8)
    expected = (1.0 + 2.0 + 0.5 * (3.0 + 4.0)) / 8
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)


def test_scaled_loss_delegates_to_replica_loss(monkeypatch):
    calls = []
    original = losses.replica_loss

    def spy(per_example_loss, batch, model=None):
        calls.append(batch)
        return original(per_example_loss, batch, model)

    monkeypatch.setattr(losses, "replica_loss", spy)
    with pytest.warns(DeprecationWarning):
        loss = losses.scaled_loss(tf.constant([1.0, 3.0]), global_count=4)
    assert len(calls) == 1 and isinstance(calls[0], tfdist.Batch)
    assert float(loss) == 1.0


def test_scaled_loss_all_reduces_the_count_in_a_replica(make_strategy):
    strategy = make_strategy(1)
    with pytest.warns(DeprecationWarning):
        loss = strategy.run(lambda: losses.scaled_loss(tf.constant([1.0, 2.0, 6.0])))
    np.testing.assert_allclose(float(loss), 3.0, rtol=1e-6)


def test_replica_loss_does_not_warn():
    batch = tfdist.Batch(x=tf.ones([2, 1]), global_examples=tf.constant([4.0, 4.0]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = losses.replica_loss(tf.constant([1.0, 3.0]), batch)
    assert not _deprecations(record)
    assert float(loss) == 1.0


# -- 2. make_loop -> HostLoop; runners internal -------------------------------


def test_make_loop_warns_naming_host_loop_and_still_runs_steps(make_strategy):
    strategy = make_strategy(1)
    with pytest.warns(DeprecationWarning, match=r"make_loop is deprecated; use "
                                                r"tfdist\.loops\.host_loop\.HostLoop"):
        loop = host_loop.make_loop(strategy, lambda element: None)
    dataset = tf.data.Dataset.from_tensor_slices(([[1.0]] * 3, [0] * 3)).batch(2)
    steps = loop(iter(tfdist.data.distribute(strategy, dataset)), tf.constant(5, tf.int64))
    assert int(steps) == 2  # the data ended inside the call


def test_make_loop_delegates_to_the_runners_device_loop(make_strategy, monkeypatch):
    seen = []
    monkeypatch.setattr(host_loop, "device_loop",
                        lambda *args, **kwargs: seen.append((args, kwargs)) or "loop")
    strategy, step = make_strategy(1), (lambda element: None)
    with pytest.warns(DeprecationWarning):
        assert host_loop.make_loop(strategy, step, check_end=False) == "loop"
    assert seen == [((strategy, step), {"after_step": None, "check_end": False})]


def test_host_loop_and_the_trainer_runners_do_not_warn(make_strategy):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        host_loop.HostLoop(make_strategy(1), lambda batch: None, steps_per_execution=2)
        device_loop.device_loop(make_strategy(1), lambda element: None)
    assert not _deprecations(record)


def test_the_runners_say_they_are_internal():
    from tfdist.loops import runners  # pylint: disable=import-outside-toplevel

    assert "Internal" in runners.__doc__ and "HostLoop" in runners.__doc__
    assert "Internal" in device_loop.__doc__


# -- 4. tfdist.tpu.tpu_strategy -> make_strategy("tpu") ------------------------


def test_tpu_strategy_warns_and_delegates_with_the_same_arguments(monkeypatch):
    seen = []
    monkeypatch.setattr(tfdist.tpu.connect, "tpu_strategy",
                        lambda *args, **kwargs: seen.append((args, kwargs)) or "strategy")
    with pytest.warns(DeprecationWarning, match=r'use tfdist\.make_strategy\("tpu", \.\.\.\)'):
        result = tfdist.tpu.tpu_strategy("my-tpu", "us-central1-b", "proj", timeout_seconds=5)
    assert result == "strategy"
    assert seen == [(("my-tpu", "us-central1-b", "proj"), {"timeout_seconds": 5})]


def test_tpu_strategy_still_checks_its_arguments():
    with pytest.warns(DeprecationWarning), pytest.raises(tfdist.ConfigurationError,
                                                         match=r"`tpu` \(''\)"):
        tfdist.tpu.tpu_strategy(tpu="")


def test_make_strategy_tpu_does_not_warn_and_tpu_strategy_is_not_exported():
    assert "tpu_strategy" not in tfdist.tpu.__all__
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(tfdist.ConfigurationError):
            tfdist.make_strategy("tpu", tpu="")  # refused before any TPU search
    assert not _deprecations(record)


# -- 3. static_shapes=True and jit_compile + "pad": both kept, documented ----


def test_static_shapes_and_jit_with_pad_differ_only_where_documented(make_strategy):
    from tfdist.replica import static_shapes  # pylint: disable=import-outside-toplevel

    strategy = make_strategy(1)
    rehearsal = static_shapes.resolve(strategy, static_shapes=True, partial_batch=None,
                                      jit_compile=False)
    xla = static_shapes.resolve(strategy, static_shapes=None, partial_batch="pad",
                                jit_compile=True)
    assert (rehearsal.partial_batch, rehearsal.jit_compile) == (xla.partial_batch, xla.jit_compile)
    assert rehearsal.static_shapes and not xla.static_shapes  # predict pads only on the first
    with pytest.raises(tfdist.ConfigurationError, match="static-shape path is on"):
        static_shapes.resolve(strategy, static_shapes=True, partial_batch="exact",
                              jit_compile=False)
    assert "Which to use when" in static_shapes.__doc__


# -- 6. exit_on_stop_signals -> PreemptionWatcher.exit_outside_training -------


@pytest.fixture
def stop_handlers_restored():
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _handlers_installed() -> bool:
    handler = preemption._on_stop_signal  # pylint: disable=protected-access
    return all(signal.getsignal(signum) is handler for signum in (signal.SIGTERM, signal.SIGINT))


def test_exit_on_stop_signals_warns_and_installs_the_handlers(stop_handlers_restored):
    del stop_handlers_restored
    with pytest.warns(DeprecationWarning, match=r"PreemptionWatcher\.exit_outside_training"):
        preemption.exit_on_stop_signals()
    if threading.current_thread() is threading.main_thread():
        assert _handlers_installed()


def test_exit_outside_training_does_not_warn(stop_handlers_restored):
    del stop_handlers_restored
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        preemption.PreemptionWatcher.exit_outside_training()
    assert not _deprecations(record)
    if threading.current_thread() is threading.main_thread():
        assert _handlers_installed()


def test_multi_worker_strategy_uses_the_kept_name():
    source = (REPO / "tfdist" / "strategies" / "multi_worker.py").read_text()
    assert "PreemptionWatcher.exit_outside_training()" in source
    assert "exit_on_stop_signals" not in source


# -- the kept ways only, in tfdist, the example programs, scripts and docs ----

_DEPRECATED_CALLS = re.compile(
    r"\b(scaled_loss|make_loop|tpu\.tpu_strategy|exit_on_stop_signals)\(")
# Where each deprecated name is defined (its alias and docstring example).
_DEFINED_IN = {"tfdist/replica/losses.py", "tfdist/loops/host_loop.py",
               "tfdist/tpu/__init__.py", "tfdist/loops/preemption.py"}


def test_tfdist_examples_and_docs_call_only_the_kept_ways():
    files = [REPO / "README.md"]
    for folder, pattern in (("tfdist", "*.py"), ("strategies", "*.py"), ("scripts", "*.py"),
                            ("docs", "*.md")):
        files += sorted((REPO / folder).rglob(pattern))
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in files if str(path.relative_to(REPO)) not in _DEFINED_IN
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _DEPRECATED_CALLS.search(line)]
    assert not found, found


# -- 5. one Slurm port scheme --------------------------------------------------

SLURM_ENVIRONMENTS = [
    # (environment, expected workers)
    ({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[3-4]",
      "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3"},
     ["node3:23872", "node3:23873", "node4:23872", "node4:23873"]),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu5",
      "SLURM_TASKS_PER_NODE": "3", "SLURM_PROCID": "0"},
     ["gpu5:20112", "gpu5:20113", "gpu5:20114"]),
    ({"SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1"},
     ["a:20000", "b:20000"]),  # no SLURM_JOB_ID: the first block
]


@pytest.mark.parametrize("env,workers", SLURM_ENVIRONMENTS)
def test_both_slurm_entry_points_give_the_same_addresses(env, workers):
    from_cluster = cluster.from_slurm(env)
    from_task = json.loads(slurm_task.tf_config(env))
    assert from_cluster.cluster == from_task["cluster"] == {"worker": workers}
    assert from_task["task"] == {"type": "worker", "index": int(env["SLURM_PROCID"])}
    assert from_cluster.to_json() == slurm_task.tf_config(env)


def test_both_slurm_entry_points_share_the_base_port():
    for job_id, base in (("0", 20000), ("7", 20112), ("1007", 20112), ("999", 35984)):
        env = {"SLURM_JOB_ID": job_id}
        assert cluster.slurm_base_port(env) == slurm_task.base_port(env) == base


def test_from_slurm_base_port_still_overrides():
    env, _ = SLURM_ENVIRONMENTS[0]
    assert cluster.from_slurm(env, base_port=12345).cluster == {"worker": [
        "node3:12345", "node3:12346", "node4:12345", "node4:12346"]}


def test_a_bad_slurm_job_id_is_the_same_error_from_both_entry_points():
    env = dict(SLURM_ENVIRONMENTS[0][0], SLURM_JOB_ID="abc")
    messages = []
    for entry in (cluster.from_slurm, slurm_task.tf_config):
        with pytest.raises(tfdist.ConfigurationError,
                           match=r"SLURM_JOB_ID \('abc'\) is not a number") as raised:
            entry(env)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
