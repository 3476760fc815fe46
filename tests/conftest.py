"""Shared test set-up: 4 logical CPU devices, made before TensorFlow starts.

Multi-replica tests on a CPU-only machine need logical devices, and those
can only be configured before the TensorFlow runtime initialises, so this
runs at import time, before any test module touches TensorFlow.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# CI's parallel pass runs two test files at a time on 2 cores. TensorFlow's
# intra-op thread pools (one thread per core, spinning while they wait for
# work) then oversubscribe the cores, and a 4-replica test that takes 7 s
# alone took 33 s beside the Ray test (92 s in one CI run); with one intra-op
# thread per process it took 15-17 s, about the fair half of two cores.
# Set before any test starts TensorFlow; subprocesses (clusters, engines)
# inherit it. Both passes run under xdist (the cluster pass two modules at
# a time), so both set it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import pytest  # noqa: E402

import tfdist  # noqa: E402

MAX_REPLICAS = 4
tfdist.strategies.configure_logical_cpus(MAX_REPLICAS)


@pytest.fixture
def make_strategy():
    """``make_strategy(num_replicas)``: one_device for 1, else mirrored."""

    from tests.support import strategy_columns  # pylint: disable=import-outside-toplevel

    return strategy_columns.in_process


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> str:
    """A data directory with tfdist's default dataset already generated,
    shared by the tests that run the programs (generating it takes ~4 s)."""
    directory = tmp_path_factory.mktemp("tensorflow_datasets")
    for split in ("train", "test"):
        tfdist.data.datasets.load_supervised("synthetic_patterns", split, data_dir=str(directory))
    return str(directory)


# Modules whose tests start TensorFlow clusters and judge timing or
# resources: how fast a dead, hung or unreachable task is named, whether
# threads / RSS / files stay flat, the launcher's signal handling. They run
# in a pass of their own after the rest (`-m serial`), two modules at a time
# (`-n 2 --dist loadfile`): beside the in-process tests, two at a time, they
# took 1.5-2x as long and the suite did not end sooner (it is CPU-bound);
# beside each other their bounds (10-60 s) hold with a wide margin.
# Everything else runs two tests at a time (`-n 2 -m "not serial"`).
# CONTRIBUTING.md.
SERIAL_MODULES = {
    "test_chaos", "test_clusters", "test_gossip_workers", "test_launcher", "test_multi_worker",
    "test_parameter_server", "test_pipeline_on_tasks", "test_reliability", "test_soak",
    "test_tensor_parallel_on_workers", "test_tpu_connect",
}
# Single tests that run in that pass too, with the reason: (module, test function).
SERIAL_TESTS = {
    # Beside another TensorFlow process its 2-replica case took 75 s and
    # 103 s in two runs instead of ~4 s alone; cause not found.
    ("test_checkpoint", "test_two_epochs_on_4_replicas_then_one_more_equals_three_on_one_device"),
}


def pytest_addoption(parser):
    parser.addoption(
        "--full", action="store_true", default=os.environ.get("TFDIST_FULL") == "1",
        help="also run the tests CI leaves out for time (marked full_form: the "
             "benchmarks' quick runs); the whole suite is --full --conformance=full")
    parser.addoption(
        "--conformance", choices=("short", "full"),
        default=os.environ.get("TFDIST_CONFORMANCE", "short"),
        help="the conformance matrix (tests/conformance): CI's short form, or all of it")
    parser.addoption(
        "--conformance-part", default=None, metavar="I/K",
        help="run only part I of K of the collected tests (every K-th, from the I-th): "
             "the full matrix in K fresh processes, one after another "
             "(scripts/conformance.py --parts=K), so no test worker grows through thousands "
             "of combinations")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "conformance: the model zoo against one device (tests/conformance)")
    config.addinivalue_line(
        "markers", "conformance_full: a combination of the full conformance matrix only "
                   "(run with --conformance=full)")
    config.addinivalue_line(
        "markers", "full_form: left out of CI for time, run with --full (a documented "
                   "command: CONTRIBUTING.md)")
    config.addinivalue_line(
        "markers", "soak: a real cluster runs for minutes (short form in CI)")
    config.addinivalue_line(
        "markers", "chaos: seeded faults on real clusters (short form in CI)")
    config.addinivalue_line(
        "markers", "serial: starts clusters and judges timing or resources, or is "
                   "pathologically slow beside the in-process tests; the second pass "
                   "(-m serial, two modules at a time)")


# The modules that take longest, in CI's order. `-n 2 --dist loadfile`
# hands out whole files in collection order, so a long file collected last
# runs alone on one core at the end while the other core idles; started
# first, the short files fill in around it (longest-first scheduling).
# Ordered by their share of a CI run (`--durations`); a module not listed
# keeps its place after these.
LONGEST_FIRST = (
    "test_benchmark_script", "test_zoo", "test_axes", "test_corpus", "test_spark",
    "test_mixed_precision", "test_program", "test_ray", "test_custom_loop",
    "test_elastic_growth", "test_sharded_state", "test_custom_training",
    "test_parameter_server_tutorial", "test_checkpoint", "test_evaluator",
    "test_multi_worker_ctl", "test_multi_worker_keras", "test_empty_replicas",
    "test_callback_files", "test_sharded_checkpoints", "test_keras_io_guide",
)


_MATRIX_DESELECTED = pytest.StashKey[int]()


def pytest_report_collectionfinish(config, start_path, startdir=None, items=()):
    """Says how much of the full conformance matrix the short form leaves out."""
    del start_path, startdir, items
    left_out = config.stash.get(_MATRIX_DESELECTED, 0)
    if left_out:
        return (f"conformance: CI's short form; {left_out} combinations of the full matrix "
                "deselected (--conformance=full runs them)")
    return None


def _start_rank(item) -> int:
    module = item.module.__name__.rsplit(".", 1)[-1]
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_rank)  # stable: the files' own order otherwise
    if config.getoption("--conformance") != "full":
        # Deselected, not skipped: the full matrix is thousands of
        # combinations, and each skipped one still runs pytest's protocol in
        # a worker and reports to the controller (measured: 6,109 of them
        # took 22 s of wall time and 34 CPU-s under `-n 2`).
        matrix_only = [item for item in items if item.get_closest_marker("conformance_full")]
        if matrix_only:
            config.hook.pytest_deselected(items=matrix_only)
            kept = set(map(id, matrix_only))
            items[:] = [item for item in items if id(item) not in kept]
            config.stash[_MATRIX_DESELECTED] = len(matrix_only)
    part = config.getoption("--conformance-part")
    if part:
        _keep_part(config, items, part)
    if not config.getoption("--full"):
        # (the kept rows are checked when whole files are collected: not under -k or ::)
        _mark_what_ci_leaves_out(items, check=not config.option.keyword and not any(
            "::" in argument for argument in config.args),
            thin=config.getoption("--conformance") != "full")
    skip_full_form = pytest.mark.skip(reason="left out of CI for time: run with --full")
    for item in items:
        if not config.getoption("--full") and item.get_closest_marker("full_form"):
            item.add_marker(skip_full_form)
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module in SERIAL_MODULES or (module, item.originalname) in SERIAL_TESTS:
            item.add_marker(pytest.mark.serial)


def _mark_what_ci_leaves_out(items, check: bool, thin: bool) -> None:
    """Marks ``full_form`` the rows and tests `tests.support.ci_form` leaves
    to ``--full``; a listed row that is not collected is an error, so the
    list cannot drift from the tests."""
    from tests.support import ci_form  # pylint: disable=import-outside-toplevel

    rows_seen = {}
    for item in items:
        key = (item.module.__name__.rsplit(".", 1)[-1], item.originalname)
        row = item.callspec.id if hasattr(item, "callspec") else None
        if key in ci_form.WHOLE:
            item.add_marker(pytest.mark.full_form)
        elif key in ci_form.ONE_ROW:
            rows_seen.setdefault(key, set()).add(row)
            if row not in ci_form.ONE_ROW[key]:
                item.add_marker(pytest.mark.full_form)
        elif thin and key in ci_form.THINNED_ROWS:
            turn = rows_seen.setdefault(key, set())
            if len(turn) % ci_form.THINNED_ROWS[key]:
                item.add_marker(pytest.mark.full_form)
            turn.add(row)
    for key, kept in ci_form.ONE_ROW.items() if check else ():
        missing = set(kept) - rows_seen.get(key, set(kept))
        if missing:
            raise pytest.UsageError(f"tests/support/ci_form.py keeps rows {sorted(missing)} of "
                                    f"{key[0]}::{key[1]}, which has no such rows")


def _keep_part(config, items, part: str) -> None:
    """Keeps part I of K (``--conformance-part=I/K``): every K-th item from
    the I-th, so each part samples the whole matrix (its costs spread evenly)."""
    try:
        index, parts = (int(number) for number in part.split("/"))
    except ValueError:
        index = parts = 0
    if not 1 <= index <= parts:
        raise pytest.UsageError(f"--conformance-part={part}: give I/K with 1 <= I <= K, e.g. 2/5")
    left_out = [item for position, item in enumerate(items) if position % parts != index - 1]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = items[index - 1::parts]


@pytest.fixture(autouse=True)
def _keep_the_test_process_after_a_stop(monkeypatch):
    """A `tfdist.Preempted` stop frees its data iterators and, if that takes
    over `tfdist.loops.preemption.RELEASE_SECONDS` (5 s), exits the process
    (the checkpoint is saved; a cluster manager's grace period is short).
    Inside a pytest process that exit kills the test worker: under CI's
    parallel load a release took longer once, the worker died and xdist
    hung. In-process tests get 120 s; programs run as subprocesses keep 5 s."""
    from tfdist.loops import preemption  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(preemption, "RELEASE_SECONDS", 120.0)
