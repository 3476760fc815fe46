"""One public way for each job: each public name at one path (a walk of
every ``__all__``), none defined in ``tfdist._internal``, the aliases
removed before 0.1.0 gone, and the two Slurm entry points giving the same
addresses.

All cheap: no cluster, no TPU; the few TensorFlow calls are eager or one
small traced loop on one device.
"""

import importlib
import inspect
import json
import pathlib
import re
import signal
import threading
import warnings

import pytest
import tensorflow as tf

import tfdist
from tfdist import cluster
from tfdist.launch import slurm_task
from tfdist.cluster import stop_signals
from tfdist.loops import host_loop, preemption
from tfdist.loops.runners import device_loop
from tfdist.replica import losses

REPO = pathlib.Path(__file__).resolve().parents[1]


def _deprecations(record):
    """tfdist's DeprecationWarnings among ``record`` (not TensorFlow's own)."""
    return [w for w in record
            if issubclass(w.category, DeprecationWarning) and "tfdist" in str(w.message)]


# -- the kept ways do not warn ---------------------------------------------


def test_replica_loss_does_not_warn():
    batch = tfdist.Batch(x=tf.ones([2, 1]), global_examples=tf.constant([4.0, 4.0]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = losses.replica_loss(tf.constant([1.0, 3.0]), batch)
    assert not _deprecations(record)
    assert float(loss) == 1.0


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


def test_make_strategy_tpu_does_not_warn():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(tfdist.errors.ConfigurationError):
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
    with pytest.raises(tfdist.errors.ConfigurationError, match="static-shape path is on"):
        static_shapes.resolve(strategy, static_shapes=True, partial_batch="exact",
                              jit_compile=False)
    assert "Which to use when" in static_shapes.__doc__


# -- stop signals outside training ------------------------------------------


@pytest.fixture
def stop_handlers_restored():
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_exit_outside_training_does_not_warn(stop_handlers_restored):
    del stop_handlers_restored
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        preemption.PreemptionWatcher.exit_outside_training()
    assert not _deprecations(record)
    if threading.current_thread() is threading.main_thread():
        assert stop_signals.handles_stop_signals()


def test_multi_worker_strategy_exits_on_stop_signals_outside_training():
    source = (REPO / "tfdist" / "strategies" / "multi_worker.py").read_text()
    assert "stop_signals.exit_outside_training()" in source


# -- removed before 0.1.0: gone, and called nowhere ---------------------------

_REMOVED = {"tfdist.replica.losses": "scaled_loss", "tfdist.loops.host_loop": "make_loop",
            "tfdist.tpu": "tpu_strategy", "tfdist.loops.preemption": "exit_on_stop_signals",
            "tfdist": "EpochDataset"}
_REMOVED_CALLS = re.compile(
    r"\b(scaled_loss|make_loop|tpu\.tpu_strategy|exit_on_stop_signals)\(")


@pytest.mark.parametrize("module,name", sorted(_REMOVED.items()))
def test_a_removed_alias_is_gone(module, name):
    assert not hasattr(importlib.import_module(module), name)


def test_tfdist_examples_and_docs_call_no_removed_alias():
    files = [REPO / "README.md"]
    for folder, pattern in (("tfdist", "*.py"), ("strategies", "*.py"), ("scripts", "*.py"),
                            ("docs", "*.md")):
        files += sorted((REPO / folder).rglob(pattern))
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}" for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _REMOVED_CALLS.search(line)]
    assert not found, found


# -- each public name at one path -------------------------------------------------


def _public_names(module_name: str, found: dict) -> dict:
    """``{id(object): [public paths]}`` over ``module_name``'s ``__all__``,
    into the tfdist modules it lists."""
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.ismodule(value):
            if value.__name__.startswith("tfdist.") and value.__name__ != module_name:
                _public_names(value.__name__, found)
            continue
        found.setdefault(id(value), (value, []))[1].append(f"{module_name}.{name}")
    return found


def test_every_public_name_is_at_one_path_and_defined_outside_internal():
    names = _public_names("tfdist", {})
    twice = [paths for _, paths in names.values() if len(paths) > 1]
    assert not twice, twice
    internal = [paths[0] for value, paths in names.values()
                if "._internal" in (getattr(value, "__module__", None) or "")]
    assert not internal, internal
    assert len(names) >= 40  # the walk reaches the subpackages


def test_the_walk_finds_a_name_at_two_paths(monkeypatch):
    """The check itself: a re-export under a second package is found."""
    monkeypatch.setattr(tfdist.strategies, "__all__",
                        tfdist.strategies.__all__ + ["make_strategy"])
    monkeypatch.setattr(tfdist.strategies, "make_strategy", tfdist.make_strategy, raising=False)
    names = _public_names("tfdist", {})
    assert any(len(paths) > 1 for _, paths in names.values())


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
        with pytest.raises(tfdist.errors.ConfigurationError,
                           match=r"SLURM_JOB_ID \('abc'\) is not a number") as raised:
            entry(env)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
