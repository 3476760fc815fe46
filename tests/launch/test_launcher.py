"""tfdist-run's layers on small commands (no TensorFlow in the tasks)."""

import io
import json
import os
import signal
import socket
import sys
import time

import pytest

from tests.support.launcher_harness import LauncherRun
from tfdist import launch
from tfdist.errors import ConfigurationError

PY = sys.executable


def _task_says(code):
    """A command whose task reads its TF_CONFIG and runs ``code``."""
    return [PY, "-c", "import json, os, sys, time\n"
            "task = json.loads(os.environ['TF_CONFIG'])['task']\n" + code]


def test_parse_args_splits_own_flags_and_command():
    config, command = launch.cli.parse_args(["--num_workers=3", "--max_restarts=2", "--", "python", "x.py", "--y=1"])
    assert (config.num_workers, config.max_restarts) == (3, 2)
    assert config.fewest_workers == 3  # no --min_workers: never shrinks
    assert command == ["python", "x.py", "--y=1"]


@pytest.mark.parametrize("argv, message", [
    (["--num_workers=2"], "needs the command after `--`"),
    (["--num_workers=2", "--"], "command after `--` is empty"),
    (["--num_workers=0", "--", "true"], r"`num_workers` \(0\) must be a positive integer"),
    (["--num_workers=2", "--max_restarts=-1", "--", "true"], r"`max_restarts` \(-1\)"),
    (["--num_workers=2", "--ports=1234", "--", "true"], "`ports` has 1 entries for 2 tasks"),
    (["--num_workers=2", "--num_ps=-1", "--", "true"], r"`num_ps` \(-1\) must be 0 or more"),
    (["--num_workers=2", "--hang_timeout=-1", "--", "true"], r"`hang_timeout` \(-1.0\) must be 0 or more"),
    (["--num_workers=2", "--min_workers=3", "--", "true"],
     r"`min_workers` \(3\) is more than `num_workers` \(2\); give --min_workers between 1 and 2"),
    (["--num_workers=2", "--min_workers=0", "--", "true"], r"`min_workers` \(0\) must be a positive integer"),
    (["--num_workers=3", "--num_ps=1", "--min_workers=2", "--", "true"],
     r"`min_workers` \(2\) is for multi-worker training without ps tasks"),
])
def test_bad_arguments(argv, message):
    with pytest.raises(ConfigurationError, match=message):
        launch.cli.parse_args(argv)


def test_parameter_server_layout_runs_the_command_as_chief_and_servers_elsewhere(tmp_path):
    config, command = launch.cli.parse_args(["--num_workers=2", "--num_ps=2", "--", "python", "train.py"])
    tasks = launch.launcher.make_tasks(config, [7001, 7002, 7003, 7004, 7005], str(tmp_path))
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1", "ps-0", "ps-1"]
    chief, worker_1, ps_1 = tasks[0], tasks[2], tasks[4]
    assert chief.command is None and not chief.server  # runs the user's command
    assert worker_1.command == ps_1.command == (PY, "-m", "tfdist.server")
    assert worker_1.server and worker_1.max_respawns == 3
    assert ps_1.server and ps_1.max_respawns == 0  # a lost ps fails the group
    tf_config = json.loads(ps_1.env["TF_CONFIG"])
    assert tf_config["task"] == {"type": "ps", "index": 1}
    assert tf_config["cluster"] == {"chief": ["127.0.0.1:7001"],
                                    "worker": ["127.0.0.1:7002", "127.0.0.1:7003"],
                                    "ps": ["127.0.0.1:7004", "127.0.0.1:7005"]}
    assert command == ["python", "train.py"]


def test_workers_serve_layout_runs_the_command_as_chief_and_stage_servers(tmp_path):
    config, _ = launch.cli.parse_args(["--num_workers=2", "--workers_serve", "--", "python",
                                       "pipeline.py"])
    assert config.num_tasks == 3
    tasks = launch.launcher.make_tasks(config, [7001, 7002, 7003], str(tmp_path))
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1"]
    assert tasks[0].command is None and not tasks[0].server
    for worker in tasks[1:]:
        assert worker.command == (PY, "-m", "tfdist.server") and worker.server
        assert worker.max_respawns == 0  # a stage's server holds its weights: a group restart
    assert json.loads(tasks[2].env["TF_CONFIG"])["cluster"] == {
        "chief": ["127.0.0.1:7001"], "worker": ["127.0.0.1:7002", "127.0.0.1:7003"]}
    with pytest.raises(ConfigurationError, match="`workers_serve` .* does not combine with ps"):
        launch.cli.parse_args(["--num_workers=2", "--workers_serve", "--num_ps=1", "--", "x"])


def test_tasks_get_tf_config_prefixed_output_and_log_files(tmp_path):
    output = io.StringIO()
    config = launch.LaunchConfig(num_workers=2, log_dir=str(tmp_path), start_timeout=0)
    result = launch.launch(config, _task_says("print('index', task['index'], os.environ['TF_CONFIG'])"), output)
    assert result.ok
    lines = output.getvalue().splitlines()
    worker_1 = next(l for l in lines if l.startswith("[worker-1] index 1 "))
    tf_config = json.loads(worker_1.split(" ", 3)[3])
    assert len(tf_config["cluster"]["worker"]) == 2
    assert all(a.startswith("127.0.0.1:") for a in tf_config["cluster"]["worker"])
    assert (tmp_path / "worker-0.log").read_text().startswith("index 0 ")


def test_first_failure_ends_the_others_and_names_the_root_cause():
    output = io.StringIO()
    config = launch.LaunchConfig(num_workers=2, start_timeout=0, grace_period=2)
    started = time.monotonic()
    result = launch.launch(config, _task_says(
        "print('about to fail') if task['index'] == 1 else None\n"
        "sys.exit(7) if task['index'] == 1 else time.sleep(120)"), output)
    assert time.monotonic() - started < 60
    assert (result.exit_code, result.failed_task) == (7, "worker-1")
    assert "worker-1: exited (exit code 7)" in output.getvalue()
    assert "  about to fail" in output.getvalue()


def test_restarts_start_the_group_again_with_new_ports(tmp_path):
    marker = tmp_path / "failed-once"
    output = io.StringIO()
    config = launch.LaunchConfig(num_workers=2, max_restarts=1, start_timeout=0, grace_period=2)
    result = launch.launch(config, _task_says(
        f"m = {str(marker)!r}\n"
        "if task['index'] == 0 and not os.path.exists(m):\n"
        "    open(m, 'w').close(); sys.exit(3)\n"), output)
    assert result.ok
    assert "restart 1/1" in output.getvalue()
    clusters = [l for l in output.getvalue().splitlines() if l.startswith("[launcher] cluster:")]
    assert len(clusters) == 2


def test_a_task_that_never_joins_is_a_clear_error_not_a_hang():
    with LauncherRun(["--num_workers=2", "--start_timeout=3", "--grace_period=2"], _task_says(
        "open(os.environ['TFDIST_READY_FILE'], 'w').close() if task['index'] == 0 else None\n"
        "time.sleep(120)")) as run:
        code = run.wait(timeout=60)
        assert code != 0
        assert "worker-1: did not join the cluster within 3 s" in run.output
        for pid in run.all_pids():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_fixed_port_in_use_is_a_clear_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = launch.main(["--num_workers=1", f"--ports={port}", "--", PY, "-c", "pass"])
    assert code == 2
    assert f"Port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_sigterm_to_the_launcher_reaches_every_task():
    with LauncherRun(["--num_workers=2", "--start_timeout=0"], _task_says(
        "import signal\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(143)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)")) as run:
        run.wait_for(r"\[worker-1\] ready", timeout=30)
        run.wait_for(r"\[worker-0\] ready", timeout=30)
        run.process.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 143
        assert "[worker-0] got SIGTERM" in run.output and "[worker-1] got SIGTERM" in run.output


def test_a_single_parameter_server_worker_is_not_respawned(tmp_path):
    """With one worker a respawn would re-run its steps from a fresh
    iterator (inexact); the group fails, and a restart resumes exactly."""
    config, _ = launch.cli.parse_args(["--num_workers=1", "--num_ps=1", "--", "python", "train.py"])
    tasks = launch.launcher.make_tasks(config, [7001, 7002, 7003], str(tmp_path))
    worker = next(t for t in tasks if t.name == "worker-0")
    assert worker.server and worker.max_respawns == 0


def test_a_sidecar_never_fails_the_group_and_is_ended_after_its_timeout():
    """An evaluator-like task: its failure is reported, not fatal; one still
    running when training is done gets ``sidecar_timeout`` s, then close."""

    for sidecar_command, said in [
            ((sys.executable, "-c", "import sys; sys.exit(3)"),
             "evaluator-0 exited (exit code 3); it runs beside training"),
            ((sys.executable, "-c", "import time; time.sleep(60)"),
             "training is done; ending evaluator-0, still running after 1 s")]:
        output = io.StringIO()
        group = launch.ProcessGroup(
            [launch.TaskSpec("worker-0", {},
                             command=(sys.executable, "-c", "import time; time.sleep(1)")),
             launch.TaskSpec("evaluator-0", {}, command=sidecar_command, sidecar=True)],
            [sys.executable, "-c", "pass"], output=output)
        group.start()
        try:
            result = group.wait(sidecar_timeout=1)
        finally:
            codes = group.close(grace_period=5)
        assert result.ok, output.getvalue()
        assert said in output.getvalue()
        assert codes["worker-0"] == 0
