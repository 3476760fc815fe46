"""scripts/benchmark.py --quick runs every kind of configuration end to end.

CI runs the entry point's checks and one benchmark (every optional
contender); each benchmark's quick run is in the full form (``--full``).

One device, MirroredStrategy(2), 2 workers under tfdist-run and a
parameter-server cluster: every contender is built, warmed up and timed
(in tiny windows: a check that the paths work, not a measurement; no
timing asserts). The benchmark and every process under it are killed by pid
when it ends or times out.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.support.engine_harness import kill_tree
from tests.support.network_limits import needs_namespaces

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run_benchmark(output_dir, flags, timeout, script="benchmark.py"):
    """Runs scripts/``script`` with ``flags`` into ``output_dir``; it and
    every process under it are killed by pid when it ends or times out."""
    command = [sys.executable, str(REPO / "scripts" / script),
               f"--output_dir={output_dir}"] + flags
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        log, _ = process.communicate(timeout=timeout)
    finally:
        kill_tree(process.pid)
    assert process.returncode == 0, log[-5000:]


@pytest.mark.full_form
def test_benchmark_quick_covers_every_strategy_kind(tmp_path):
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    _run_benchmark(tmp_path, ["--quick"] + (["--plot"] if has_matplotlib else []), timeout=900)

    runs = json.loads((tmp_path / "benchmark.json").read_text())
    by_strategy = {run["config"]["strategy"]: run for run in runs}
    assert set(by_strategy) == {"one_device", "mirrored:2", "multi_worker:2",
                                "parameter_server:1"}
    for strategy, run in by_strategy.items():
        results = run["results"]
        expected = ({"tfdist", "custom_loop"} if strategy.startswith("parameter_server")
                    else {"tfdist", "tfdist_attach", "keras_fit", "custom_loop"})
        assert set(results) == expected, strategy
        for name in expected - {"keras_fit"}:  # Keras may fail; tfdist and the loop may not
            rates = results[name]["rates"]
            assert min(rates) > 0, (strategy, name, results[name])
            # One window per round; the loop's around every other window.
            assert len(rates) >= 2 if name == "custom_loop" else len(rates) == 2, (strategy, name)
        # Each of tfdist's 2 windows paired with the loop windows on both sides.
        assert results["tfdist"]["vs_loop"]["n"] == 4
        if "keras_fit" in expected:  # Keras 3 fit fails under some strategies: recorded
            assert "examples_per_s" in results["keras_fit"] or "error" in results["keras_fit"]
    table = (tmp_path / "benchmark.txt").read_text()
    assert "multi_worker:2" in table and "parameter_server:1" in table
    markdown = (tmp_path / "benchmark.md").read_text()
    assert "| tfdist vs loop |" in markdown and "| mlp |" in markdown
    if has_matplotlib:
        assert (tmp_path / "ratios.png").stat().st_size > 0
        assert (tmp_path / "scaling.png").stat().st_size > 0
    else:
        pytest.skip("matplotlib not installed: --plot not exercised (pip install '.[plot]')")


def test_every_optional_contender_runs(tmp_path, monkeypatch):
    """The contenders that take tfdist's gap apart (its data, its step, its
    log points...) are built, warmed up and timed like the default ones."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from bench import contenders  # pylint: disable=import-outside-toplevel

    names = list(contenders.OPTIONAL) + [contenders.REFERENCE]
    _run_benchmark(tmp_path, ["--strategies=one_device", "--models=mlp",
                              "--steps_per_execution=2", f"--contenders={','.join(names)}",
                              "--rounds=1", "--window_seconds=0.05", "--probe_steps=4"],
                   timeout=600)
    (run,) = json.loads((tmp_path / "benchmark.json").read_text())
    assert set(run["results"]) == set(names)
    for name in names:
        assert "error" not in run["results"][name], (name, run["results"][name])
        assert min(run["results"][name]["rates"]) > 0, name


@pytest.mark.full_form
def test_checkpoint_benchmark_quick_times_every_form(tmp_path):
    """scripts/checkpoint_benchmark.py --quick: no saves, synchronous and
    background saves each timed (paired with no saves) and measured for
    memory and save duration in a process of its own (no timing asserts)."""
    _run_benchmark(tmp_path, ["--quick"], 600, "checkpoint_benchmark.py")
    result = json.loads((tmp_path / "checkpoint_benchmark.json").read_text())
    assert set(result["rates"]) == {"none", "sync", "async"}
    assert set(result["vs_none"]) == {"sync", "async"}
    assert all(min(rates) > 0 for rates in result["rates"].values())
    for form in ("sync", "async"):
        memory = result["memory"][form]
        assert memory["checkpoint_mb"] > 0 and memory["complete_ms"] > 0, memory
        # what a save adds, by steps since the save: one median per step of the interval
        assert len(result["what_a_save_adds"][form]["by_steps_since_save_ms"]) == 20
    assert result["step_without_saves_ms"] > 0
    assert "| async |" in (tmp_path / "checkpoint_benchmark.md").read_text()
    assert "the step the save falls in" in (tmp_path / "checkpoint_benchmark.md").read_text()


@pytest.mark.full_form
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--spare_core needs 2 CPUs")
def test_checkpoint_benchmark_spare_core_gives_the_writer_a_cpu_of_its_own(tmp_path):
    """--spare_core: training on one CPU, TensorFlow's writer thread moved
    to another (every async save's thread), each form still timed."""
    _run_benchmark(tmp_path, ["--quick", "--spare_core"], 600, "checkpoint_benchmark.py")
    result = json.loads((tmp_path / "checkpoint_benchmark_spare_core.json").read_text())
    config = result["config"]
    assert config["spare_core"] and len(config["training_cpus"]) == 1, config
    assert len(config["writer_cpus"]) == 1 and config["writer_cpus"] != config["training_cpus"]
    assert config["writer_threads_placed"] >= 1, config
    assert all(min(rates) > 0 for rates in result["rates"].values())
    assert not (tmp_path / "checkpoint_benchmark.json").exists()


@pytest.mark.full_form
def test_pipeline_benchmark_quick_measures_each_schedule_and_m(tmp_path):
    """scripts/pipeline_benchmark.py --quick: each schedule and m in its own
    process; each stage holds half of the weights and state (equal stages),
    and the peak is measured (no figure asserted)."""
    _run_benchmark(tmp_path, ["--quick"], 600, "pipeline_benchmark.py")
    rows = json.loads((tmp_path / "pipeline_benchmark.json").read_text())["rows"]
    assert [(r["schedule"], r["micro_batches"]) for r in rows] == [
        ("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)]
    for row in rows:
        first, second = row["held_mb_per_stage"]
        assert first > 0 and abs(first - second) < 0.2 * first, row  # (projection, output)
        assert row["peak_mb"] > 0
    assert "| 1f1b | 4 |" in (tmp_path / "pipeline_benchmark.md").read_text()


@pytest.mark.full_form
def test_pipeline_traffic_benchmark_quick_sums_what_crosses_devices(tmp_path):
    """scripts/pipeline_traffic_benchmark.py --quick: 2 replicas x 2 stages;
    the later stage's gradients cross to the replica's device and back
    (weights-sized bytes: twice the later stage's weights per replica), the
    micro-batches' tensors cross, and every gradient is all-reduced."""
    _run_benchmark(tmp_path, ["--quick"], 600, "pipeline_traffic_benchmark.py")
    rows = json.loads((tmp_path / "pipeline_traffic_benchmark.json").read_text())["rows"]
    assert [(r["layout"], r["micro_batches"]) for r in rows] == [("strategy", 2)]
    row = rows[0]
    assert row["per_row_mb"] > 0 and row["weight_sized_mb"] > 0, row
    assert abs(row["all_reduce_mb_per_replica"] - row["weights_mb"]) < 1e-3, row
    assert "| strategy | sgd | 2 |" in (tmp_path / "pipeline_traffic_benchmark.md").read_text()


@pytest.mark.full_form
def test_pipeline_bubble_benchmark_quick_records_every_pass(tmp_path):
    """scripts/pipeline_bubble_benchmark.py --quick: each schedule in its
    own process (interleaved 1F1B with 2 stages on each of the 2 devices);
    every step records each stage's forward and backward pass of every
    micro-batch (the script refuses a step that does not), and the idle
    fractions are fractions (no timing asserted)."""
    _run_benchmark(tmp_path, ["--quick"], 600, "pipeline_bubble_benchmark.py")
    rows = json.loads((tmp_path / "pipeline_bubble_benchmark.json").read_text())["rows"]
    assert [(r["devices"], r["stages"], r["micro_batches"], r["schedule"]) for r in rows] == [
        (2, 2, 2, "gpipe"), (2, 2, 2, "1f1b"), (2, 4, 2, "interleaved_1f1b")]
    for row in rows:
        assert row["steps"] == 2 and len(row["idle_per_device"]) == 2, row
        assert all(0 <= idle < 1 for idle in row["idle_per_device"]), row
    assert [row["theory_idle"] for row in rows] == [1 / 3, 1 / 3, 1 / 5]


@pytest.mark.full_form
@needs_namespaces
def test_pipeline_cluster_benchmark_quick_runs_both_networks(tmp_path):
    """scripts/pipeline_cluster_benchmark.py --quick: a chief and a worker
    server on a limited network, then unlimited; the pipeline's link bytes
    per step hold at least its activations (no timing asserted)."""
    _run_benchmark(tmp_path, ["--quick"], 900, "pipeline_cluster_benchmark.py")
    rows = json.loads((tmp_path / "pipeline_cluster_benchmark.json").read_text())["rows"]
    assert [r["form"] for r in rows] == ["one_process", "pipeline"]
    pipeline = rows[1]
    assert pipeline["link_mb_per_step"] >= pipeline["activation_mb_per_step"] > 0, pipeline


@pytest.mark.full_form
def test_sharding_benchmark_quick_measures_both_forms(tmp_path):
    """scripts/sharding_benchmark.py --quick: each form in its own process;
    the sharded state per replica is the plain one over N (to a shard's
    padding), measured from the optimizer's variables (no timing asserts)."""
    _run_benchmark(tmp_path, ["--quick"], 600, "sharding_benchmark.py")
    rows = json.loads((tmp_path / "sharding_benchmark.json").read_text())["rows"]
    assert [(r["replicas"], r["sharded"]) for r in rows] == [
        (2, False), (2, True), (3, False), (3, True)]
    for plain, sharded in zip(rows[::2], rows[1::2]):
        replicas = plain["replicas"]
        expected = plain["state_mb_per_replica"] / replicas
        assert abs(sharded["state_mb_per_replica"] - expected) < 0.01 * expected + 1e-4, rows
        assert min(plain["step_seconds"], sharded["step_seconds"]) > 0
    assert "| sharded |" in (tmp_path / "sharding_benchmark.md").read_text()


@pytest.mark.full_form
def test_tables_benchmark_quick_times_every_form(tmp_path):
    """scripts/tables_benchmark.py --quick: Keras fit, tfdist on one device
    and on 2 replicas, the table whole and sharded, each table size and
    optimizer in its own process (no timing asserts); sharded, the first
    device holds half the table and its state."""
    _run_benchmark(tmp_path, ["--quick"], 600, "tables_benchmark.py")
    rows = json.loads((tmp_path / "tables_benchmark.json").read_text())["rows"]
    assert [(r["optimizer"], r["rows"], r["form"]) for r in rows] == [
        (optimizer, size, form) for optimizer in ("sgd", "adagrad") for size in (1000, 10000)
        for form in ("keras", "tfdist1", "tfdist2", "sharded2")]
    assert all(r["step_ms"] > 0 for r in rows), rows
    held = {(r["optimizer"], r["form"]): r["state_mb_first_device"] for r in rows
            if r["rows"] == 10000}
    table = 10000 * 32 * 4 / 2**20  # (MB; Adagrad keeps one accumulator of its size)
    for optimizer, copies in (("sgd", 1), ("adagrad", 2)):
        assert held[(optimizer, "tfdist2")] == pytest.approx(copies * table, rel=0.01)
        assert held[(optimizer, "sharded2")] == pytest.approx(copies * table / 2, rel=0.02)
    assert "| adagrad | tfdist 2 sharded |" in (tmp_path / "tables_benchmark.md").read_text()


@needs_namespaces
@pytest.mark.full_form
def test_tables_cluster_benchmark_quick_measures_every_form_on_both_networks(tmp_path):
    """scripts/tables_cluster_benchmark.py --quick: 2 workers, the table
    replicated and sharded in turn, then 2 workers and 2 ps, on a limited
    network and unlimited (no timing asserts): sharded, each worker holds
    half the table and its state; on ps, each ps holds half and every id
    crosses the link; a step moves less than the table's bytes."""
    _run_benchmark(tmp_path, ["--quick"], 900, "tables_cluster_benchmark.py")
    rows = {r["form"]: r for r in
            json.loads((tmp_path / "tables_cluster_benchmark.json").read_text())["rows"]}
    assert set(rows) == {"replicated", "sharded", "parameter servers"}
    table_and_state = 2 * 10000 * 32 * 4 / 2**20  # (MB: the table and Adagrad's accumulator)
    assert rows["replicated"]["held_mb_per_worker"] == pytest.approx(table_and_state, rel=0.01)
    assert rows["sharded"]["held_mb_per_worker"] == pytest.approx(table_and_state / 2, rel=0.02)
    on_ps = rows["parameter servers"]
    assert on_ps["held_mb_per_worker"] == pytest.approx(table_and_state / 2, rel=0.02)
    assert on_ps["ids_and_vectors_mb"] > rows["sharded"]["ids_and_vectors_mb"]
    for row in rows.values():
        assert 0 < row["ids_and_vectors_mb"] < row["table_mb"], row
        assert 0 < row["link_mb_per_step"] and row["ms_per_step"] > 0, row


@pytest.mark.full_form
def test_data_service_benchmark_quick_runs_both_strategies(tmp_path):
    """2 training workers with 1 tf.data service worker (mwms) and with 2
    (parameter servers, dynamic sharding), real tfdist-run clusters; CPU
    figures recorded, no timing asserts."""
    _run_benchmark(tmp_path, ["--quick"], 600, "data_service_benchmark.py")
    result = json.loads((tmp_path / "data_service_benchmark.json").read_text())
    medians = result["medians"]
    assert set(medians) == {"mwms, 1", "ps, 2"}
    assert all(m["steps_per_s"] > 0 and m["trainer_cpu_ms_per_step"] > 0
               and m["service_cpu_ms_per_step"] > 0 for m in medians.values())


@needs_namespaces
@pytest.mark.full_form
def test_compression_benchmark_quick_on_a_limited_network(tmp_path):
    """Under tfdist-run --bandwidth=1gbit: every configuration timed, its
    link bytes counted, its accuracy measured (no timing asserts)."""
    _run_benchmark(tmp_path, ["--quick", f"--data_dir={tmp_path / 'tensorflow_datasets'}"],
                   900, "compression_benchmark.py")
    result = json.loads((tmp_path / "compression_benchmark.json").read_text())
    assert set(result["medians"]) == {"none", "bf16", "fp16"}
    assert all(m["bytes_per_step"] > 0 for m in result["medians"].values())
    assert all(0 <= a <= 1 for a in result["accuracy"].values())


@needs_namespaces
@pytest.mark.full_form
def test_sharding_cluster_benchmark_quick_measures_workers_and_the_network(tmp_path):
    """scripts/sharding_cluster_benchmark.py --quick: 2 workers per form for
    memory (resident, then live tensors under the BFC allocator), then the
    three forms in turn under --bandwidth=1gbit and unlimited; the ring bound
    computed (no timing asserts); background saves, whose host copy under
    fully sharded weights is each worker's half."""
    _run_benchmark(tmp_path, ["--quick", "--parts=memory,network,saves"], 900,
                   "sharding_cluster_benchmark.py")
    result = json.loads((tmp_path / "sharding_cluster_benchmark.json").read_text())
    memory = {row["form"]: row for row in result["memory"]}
    assert set(memory) == {"plain", "sharded", "fully_sharded"}
    assert memory["sharded"]["state_mb"] < memory["plain"]["state_mb"]
    assert memory["fully_sharded"]["state_mb"] == memory["sharded"]["state_mb"]
    assert memory["fully_sharded"]["weights_mb"] < memory["sharded"]["weights_mb"] == (
        memory["plain"]["weights_mb"])
    for row in memory.values():  # the weights are live before fit; the state is made in it
        assert 0 < row["tensor_before_fit_mb"] < row["tensor_peak_mb"]
    network = {row["form"]: row for row in result["network"]}
    assert set(network) == {"plain", "sharded", "fully_sharded"}
    assert all(row["link_mb_per_step"] > 0 and row["ring_bound_seconds"] > 0
               for row in network.values())
    saves = {row["form"]: row for row in result["saves"]}
    assert saves["plain"]["host_copy_mb"] >= saves["plain"]["weights_and_state_mb"]
    assert saves["fully_sharded"]["host_copy_mb"] < 0.6 * saves["plain"]["host_copy_mb"]


@pytest.mark.full_form
def test_memory_budget_benchmark_quick_runs_every_form_under_the_budget(tmp_path):
    """scripts/memory_budget_benchmark.py --quick: 2 workers per form under a
    24 MB budget of live tensors, a model (weights + Adam state) of 1.0
    times it; plain data parallelism runs out of memory (the allocator's
    own error), fully sharded weights train within the budget."""
    _run_benchmark(tmp_path, ["--quick"], 900, "memory_budget_benchmark.py")
    result = json.loads((tmp_path / "memory_budget_benchmark.json").read_text())
    rows = {row["form"]: row for row in result["rows"]}
    assert set(rows) == {"plain", "sharded", "fully_sharded", "fully_sharded_no_prefetch",
                         "fully_sharded_kept"}
    assert not rows["plain"]["trained"] and "OOM" in rows["plain"]["error"], rows["plain"]
    assert rows["fully_sharded"]["trained"], rows["fully_sharded"]
    assert rows["fully_sharded"]["tensor_peak_mb"] <= 24


@pytest.mark.full_form
def test_memory_budget_benchmark_trains_a_table_larger_than_the_budget(tmp_path):
    """``--model=table --quick``: an embedding table whose weights + Adam
    state are 1.0 times a worker's 24 MB budget; replicated (plain, sharded
    state) it runs out of memory, sharded by rows (FullySharded) each
    worker holds half of it and trains."""
    _run_benchmark(tmp_path, ["--quick", "--model=table"], 900, "memory_budget_benchmark.py")
    result = json.loads((tmp_path / "memory_budget_table_benchmark.json").read_text())
    rows = {row["form"]: row for row in result["rows"]}
    assert set(rows) == {"plain", "sharded", "fully_sharded"}
    assert not rows["plain"]["trained"] and "OOM" in rows["plain"]["error"], rows["plain"]
    assert rows["fully_sharded"]["trained"], rows["fully_sharded"]
    assert rows["fully_sharded"]["weights_mb"] == pytest.approx(result["model_mb"] / 3 / 2,
                                                                rel=0.01)


@needs_namespaces
def test_allreduce_benchmark_quick_measures_against_the_ring_bound(tmp_path):
    """Under tfdist-run --bandwidth=1gbit, 2 workers: compute and all-reduce
    timed for each packing, the shared-link ring bound computed, and with
    matplotlib installed (the plot extra) the plot drawn (no timing
    asserts)."""
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    _run_benchmark(tmp_path, ["--quick"] + (["--plot"] if has_matplotlib else []), 600,
                   "allreduce_benchmark.py")
    result = json.loads((tmp_path / "allreduce_benchmark.json").read_text())
    (row,) = result["results"]["2 workers, 1gbit"]
    # 2 (N - 1) x bytes over 1 Gbit/s, every task on one link.
    assert row["bound_seconds"] == pytest.approx(2 * row["bytes"] * 8 / 1e9)
    assert set(row["all_reduce_seconds"]) == {"0", "4194304"}
    assert all(s > 0 for s in row["all_reduce_seconds"].values()) and row["compute_seconds"] > 0
    assert (tmp_path / "allreduce_benchmark.png").exists() == has_matplotlib


@needs_namespaces
@pytest.mark.full_form
def test_time_to_accuracy_quick_times_every_configuration_to_its_target(tmp_path):
    """Under tfdist-run --bandwidth=1gbit, 2 workers: synchronous, bf16 and
    local SGD (H = 4, 16) runs, each evaluated off the clock at every copy;
    the table's times and steps are read from those curves (no timing
    asserts)."""
    _run_benchmark(tmp_path, ["--quick", f"--data_dir={tmp_path / 'tensorflow_datasets'}"],
                   900, "time_to_accuracy.py")
    result = json.loads((tmp_path / "time_to_accuracy.json").read_text())
    curves = result["curves"]
    assert list(curves) == ["synchronous", "bf16", "LocalSGD(H=4)", "LocalSGD(H=16)"]
    for name, curve in curves.items():
        assert [point["steps"] for point in curve] == [16, 32], name  # 39 steps: 2 copies
        assert 0 < curve[0]["seconds"] < curve[1]["seconds"], name
        assert all(0 <= point["accuracy"] <= 1 for point in curve), name
        first = next((p for p in curve if p["accuracy"] >= 0.1), None)
        assert result["time_to_target"][name] == first, name
    table = (tmp_path / "time_to_accuracy.md").read_text()
    assert table.count("\n") == 2 + len(curves)
    assert "| synchronous |" in table and "| LocalSGD(H=16) |" in table


@needs_namespaces
@pytest.mark.full_form
def test_gossip_benchmark_quick_measures_every_configuration_on_four_workers(tmp_path):
    """Under tfdist-run --bandwidth=1gbit, 4 workers: synchronous, local SGD
    and gossip on a ring and the exponential graph, each with an accuracy
    after its epoch, bytes per worker per step near the algorithm's count,
    and (gossip) the workers' spread, which is not 0 between epoch ends
    (no timing asserts)."""
    _run_benchmark(tmp_path, ["--quick", f"--data_dir={tmp_path / 'tensorflow_datasets'}"],
                   900, "gossip_benchmark.py")
    rows = json.loads((tmp_path / "gossip_benchmark.json").read_text())["runs"]["1gbit"]
    assert list(rows) == ["synchronous", "LocalSGD(H=4)", "Gossip(ring)", "Gossip(exponential)"]
    for name, row in rows.items():
        assert len(row["curve"]) == 1 and 0 <= row["curve"][0]["accuracy"] <= 1, name
        # The algorithm's bytes, and at most the reports, the epoch's end and TensorFlow's
        # own messages on top.
        assert row["algorithm_mb_per_worker_per_step"] <= row["mb_per_worker_per_step"], name
        assert row["mb_per_worker_per_step"] < 3 * row["algorithm_mb_per_worker_per_step"], name
    for name in ("Gossip(ring)", "Gossip(exponential)"):
        assert rows[name]["largest_spread"] > 0, name
    assert rows["synchronous"]["largest_spread"] is None


def test_time_to_accuracy_table_reads_the_first_evaluation_at_the_target(monkeypatch):
    """Hand-made curves: the first evaluation at or above the target is
    taken (not the best), a run that never reaches it says so, and the
    speed-up divides the baseline's time by the run's."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from bench import accuracy_curves  # pylint: disable=import-outside-toplevel

    point = lambda steps, seconds, accuracy: {  # noqa: E731
        "steps": steps, "seconds": seconds, "accuracy": accuracy}
    curves = {"synchronous": [point(16, 12.0, 0.80), point(32, 24.0, 0.91), point(48, 36.0, 0.93)],
              "fast": [point(16, 3.0, 0.905), point(32, 6.0, 0.89), point(48, 9.0, 0.92)],
              "never": [point(16, 1.0, 0.5), point(32, 2.0, 0.6)]}
    assert accuracy_curves.time_to(curves["fast"], 0.9) == curves["fast"][0]
    assert accuracy_curves.time_to(curves["never"], 0.9) is None
    rows = accuracy_curves.table(curves, 0.9, passes=3).splitlines()
    # The second target: the synchronous run's last accuracy (93%) less half a point.
    assert rows[0].startswith("| training | seconds to 90% | steps | speed-up | seconds to "
                              "92.50% | steps | speed-up | s per step | accuracy after 3 epochs |")
    assert rows[2] == "| synchronous | 24 | 32 | 1.00x | 36 | 48 | 1.00x | 0.750 | 93.00% |"
    assert rows[3] == "| fast | 3 | 16 | 8.00x | not reached | - | - | 0.188 | 92.00% |"
    assert rows[4] == "| never | not reached | - | - | not reached | - | - | 0.062 | 60.00% |"


# -- the one entry point: python -m scripts.bench --------------------------------

def test_every_measuring_script_is_in_the_one_entry_point():
    """scripts/ holds the tools; their child programs (run under tfdist-run,
    not by hand) are in scripts/bench/ with the harness."""
    from scripts.bench.registry import TOOLS  # pylint: disable=import-outside-toplevel

    scripts = {path.name for path in (REPO / "scripts").glob("*.py")}
    assert {tool.script for tool in TOOLS.values()} == scripts


def test_the_entry_point_lists_the_tools_and_names_an_unknown_one():
    listed = subprocess.run([sys.executable, "-m", "scripts.bench"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=True)
    assert "training" in listed.stdout and "conformance" in listed.stdout
    unknown = subprocess.run([sys.executable, "-m", "scripts.bench", "trainig"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "no tool 'trainig'" in unknown.stderr


def test_the_entry_point_passes_flags_to_the_tool():
    # (absl's --help exits 1, as every absl program's does.)
    shown = subprocess.run([sys.executable, "-m", "scripts.bench", "chaos", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=False)
    assert "--trials" in shown.stdout


def test_every_benchmark_declares_the_common_flags_once():
    for name in ("allreduce_benchmark", "benchmark", "checkpoint_benchmark",
                 "compression_benchmark", "data_service_benchmark", "memory_budget_benchmark",
                 "sharding_benchmark",
                 "sharding_cluster_benchmark", "tables_cluster_benchmark",
                 "time_to_accuracy", "gossip_benchmark"):
        source = (REPO / "scripts" / f"{name}.py").read_text()
        assert 'DEFINE_bool("quick"' not in source and 'DEFINE_string("output_dir"' not in source
        assert f'define_common(\n    "{name}"' in source or f'define_common("{name}"' in source


def test_every_measuring_tool_parses_its_flags_with_absl():
    """One flag library for the tools and their child programs (absl, as the
    benchmarks' shared flags in `scripts.bench.flags`)."""
    sources = sorted((REPO / "scripts").rglob("*.py"))
    assert len(sources) > 20
    with_argparse = [str(p.relative_to(REPO)) for p in sources if "import argparse" in p.read_text()]
    assert not with_argparse


@pytest.mark.full_form
def test_tensor_parallel_benchmark_quick_counts_what_the_layout_implies(tmp_path):
    """scripts/tensor_parallel_benchmark.py --quick: per device, a mesh keeps
    less than one device; the activations crossing devices are what the
    layout implies, and on one replica no weight-sized tensor crosses."""
    _run_benchmark(tmp_path, ["--quick"], 600, "tensor_parallel_benchmark.py")
    rows = {r["layout"]: r for r in json.loads(
        (tmp_path / "tensor_parallel_benchmark.json").read_text())["rows"]}
    assert sorted(rows) == ["data_2", "mesh_1x2", "mesh_1x2x2", "mesh_2x2", "mesh_2x2_fs",
                            "one_device"]
    assert rows["mesh_1x2"]["most_kept_on_a_device_mb"] < rows["one_device"][
        "most_kept_on_a_device_mb"] * 0.6
    for name in ("mesh_1x2", "mesh_2x2"):
        assert abs(rows[name]["activation_mb"] - rows[name]["implied_mb"]) < 1e-6, rows[name]
    # With 2 stages too: a quarter of the pairs' weights per device; the
    # layout's activations and more (a pair's parts joined between units)
    composed = rows["mesh_1x2x2"]
    assert composed["most_kept_on_a_device_mb"] < rows["mesh_1x2"][
        "most_kept_on_a_device_mb"] * 0.6, composed
    assert composed["activation_mb"] > composed["implied_mb"], composed
    for name in ("mesh_1x2", "mesh_1x2x2"):
        assert rows[name]["weight_sized_mb"] == 0, rows[name]
    # Sliced over the 2 replicas too: about half of mesh_2x2's per device,
    # gathered and reduce-scattered where the shards live (no weight-sized
    # crossing, no gradient all-reduce); the layout's activations and more
    # (each layer a unit, recomputed in the backward pass)
    sliced = rows["mesh_2x2_fs"]
    assert sliced["most_kept_on_a_device_mb"] < rows["mesh_2x2"][
        "most_kept_on_a_device_mb"] * 0.6, sliced
    assert sliced["gather_mb_per_replica"] > 0 and sliced["weight_sized_mb"] == 0, sliced
    assert sliced["all_reduce_mb_per_replica"] < rows["mesh_2x2"][
        "all_reduce_mb_per_replica"] * 0.1, sliced
    assert sliced["activation_mb"] >= sliced["implied_mb"], sliced
    assert "| mesh_2x2 |" in (tmp_path / "tensor_parallel_benchmark.md").read_text()


@pytest.mark.full_form
def test_sequence_parallel_benchmark_quick_keeps_less_on_the_first_device(tmp_path):
    """scripts/sequence_parallel_benchmark.py --quick: every layout runs;
    splitting the replicated region by sequence keeps fewer of the step's
    activations on the first device than tensor parallelism alone (which
    keeps fewer than one device), for more bytes between devices (the
    input's cut, the output's join, the residual stream's gradients)."""
    _run_benchmark(tmp_path, ["--quick"], 600, "sequence_parallel_benchmark.py")
    rows = {r["layout"]: r for r in json.loads(
        (tmp_path / "sequence_parallel_benchmark.json").read_text())["rows"]}
    assert sorted(rows) == ["mesh_1x2", "mesh_1x2_sp", "mesh_1x4", "mesh_1x4_sp", "one_device"]
    for model_axis in ("1x2", "1x4"):
        plain, split = rows[f"mesh_{model_axis}"], rows[f"mesh_{model_axis}_sp"]
        assert split["kept_mb_first"] < plain["kept_mb_first"] < rows["one_device"][
            "kept_mb_first"], (plain, split)
        assert split["activation_mb"] > plain["activation_mb"] > 0, (plain, split)
    assert "| mesh_1x2_sp |" in (tmp_path / "sequence_parallel_benchmark.md").read_text()


@pytest.mark.full_form
@needs_namespaces
def test_tensor_parallel_benchmark_on_workers_moves_the_gradients_once(tmp_path):
    """scripts/tensor_parallel_benchmark.py --workers --quick: 2 workers on a
    1gbit link, data parallel and a 2 x 2 mesh; the mesh keeps less per
    device, and both send the gradients' ring all-reduce over the link
    (what the namespace's loopback carried, within 10% of the bound)."""
    _run_benchmark(tmp_path, ["--quick", "--workers"], 600, "tensor_parallel_benchmark.py")
    rows = {r["layout"]: r for r in json.loads(
        (tmp_path / "tensor_parallel_benchmark.json").read_text())["rows"]}
    assert sorted(rows) == ["workers_data", "workers_mesh_2x2"]
    assert rows["workers_mesh_2x2"]["most_kept_on_a_device_mb"] < rows["workers_data"][
        "most_kept_on_a_device_mb"] * 0.6
    for row in rows.values():
        assert row["bound_mb"] <= row["link_mb_per_step"] < 1.1 * row["bound_mb"], row
