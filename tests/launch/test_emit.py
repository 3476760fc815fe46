"""tfdist-run --emit: a Kubeflow TFJob manifest and a Slurm sbatch script.

The TFJob is checked field by field against the TFJob v1 API (what the
training operator reads) and parsed back as YAML; the TF_CONFIG the
operator would give each replica goes through `tfdist.cluster.from_tfjob`.
The Slurm script is run for real with bash, its ``srun`` replaced by a
stand-in that starts the tasks as srun would, with the variables a 2-task
allocation on 127.0.0.1 sets.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tfdist import cluster
from tfdist.errors import ConfigurationError
from tfdist.launch import cli, emit, slurm_task

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMAND = ["python", "strategies/multi_worker_mirrored.py", "--epochs=3"]


def _emit(args, command=COMMAND):
    kind, spec = cli.parse_emit_args(args + ["--"] + command)
    return emit.emit(kind, spec)


def _containers(manifest, role):
    replica = manifest["spec"]["tfReplicaSpecs"][role]
    return replica, replica["template"]["spec"]["containers"]


def test_tfjob_for_multi_worker_mirrored_has_the_v1_fields_and_types():
    yaml = pytest.importorskip("yaml")
    manifest = yaml.safe_load(_emit(["--emit=tfjob", "--image=repo/train:1", "--num_workers=3",
                                     "--cpu=4", "--memory=16Gi", "--gpus=1", "--name=mnist-run"]))
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    assert manifest["metadata"] == {"name": "mnist-run"}
    assert set(manifest["spec"]["tfReplicaSpecs"]) == {"Worker"}
    replica, containers = _containers(manifest, "Worker")
    assert replica["replicas"] == 3 and isinstance(replica["replicas"], int)
    assert replica["restartPolicy"] == "OnFailure"
    (container,) = containers
    assert container["name"] == "tensorflow"  # the operator requires this name
    assert container["image"] == "repo/train:1"
    assert container["command"] == COMMAND
    assert container["resources"] == {"limits": {"cpu": "4", "memory": "16Gi",
                                                 "nvidia.com/gpu": 1}}


def test_tfjob_with_parameter_servers_runs_the_command_on_the_chief_only():
    yaml = pytest.importorskip("yaml")
    manifest = yaml.safe_load(_emit(["--emit=tfjob", "--image=img", "--num_workers=2",
                                     "--num_ps=1", "--gpus=1", "--restart_policy=ExitCode"]))
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert list(replicas) == ["Chief", "Worker", "PS"]
    assert [replicas[r]["replicas"] for r in replicas] == [1, 2, 1]
    assert {replicas[r]["restartPolicy"] for r in replicas} == {"ExitCode"}
    assert _containers(manifest, "Chief")[1][0]["command"] == COMMAND
    for role in ("Worker", "PS"):
        assert _containers(manifest, role)[1][0]["command"] == ["python", "-m", "tfdist.server"]
    assert "resources" not in _containers(manifest, "PS")[1][0]  # no GPU for a ps


@pytest.mark.parametrize("role, index", [("chief", 0), ("worker", 1), ("ps", 0)])
def test_the_tf_config_the_operator_sets_is_read_by_from_tfjob(role, index):
    """What the training operator sets for a Chief + 2 Worker + 1 PS job."""
    operator_tf_config = json.dumps({
        "cluster": {"chief": ["tfdist-chief-0.default.svc:2222"],
                    "worker": ["tfdist-worker-0.default.svc:2222",
                               "tfdist-worker-1.default.svc:2222"],
                    "ps": ["tfdist-ps-0.default.svc:2222"]},
        "task": {"type": role, "index": index}, "environment": "cloud"})
    config = cluster.from_tfjob({"TF_CONFIG": operator_tf_config})
    assert (config.task_type, config.task_index) == (role, index)
    assert config.is_chief == (role == "chief")


def test_from_tfjob_outside_a_tfjob_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="TF_CONFIG is not set: not inside a TFJob"):
        cluster.from_tfjob({})


@pytest.mark.parametrize("args, message", [
    (["--emit=tfjob", "--num_workers=2"], "`--emit=tfjob` needs `--image=IMAGE`"),
    (["--emit=yaml", "--num_workers=2"], r"`--emit` \('yaml'\) must be one of trainjob, tfjob, slurm"),
    (["--emit=tfjob", "--image=i", "--num_workers=2", "--restart_policy=Sometimes"],
     r"`--restart_policy` \('Sometimes'\) must be one of OnFailure"),
    (["--emit=tfjob", "--image=i", "--num_workers=2", "--name=my_job"],
     r"`--name` \('my_job'\) must be letters, digits and '-'"),
    (["--emit=tfjob", "--image=i", "--num_workers=0"], r"`num_workers` \(0\)"),
    (["--emit=slurm", "--num_workers=2", "--num_ps=1"], "`--emit=slurm` starts workers only"),
])
def test_bad_emit_arguments_are_named(args, message):
    with pytest.raises(ConfigurationError, match=message):
        _emit(args)


def test_tfdist_run_prints_the_manifest_and_exits_0(capsys):
    assert cli.main(["--emit=tfjob", "--image=img", "--num_workers=2", "--"] + COMMAND) == 0
    assert 'kind: "TFJob"' in capsys.readouterr().out
    assert cli.main(["--emit=tfjob", "--num_workers=2", "--"] + COMMAND) == 2
    assert "needs `--image=IMAGE`" in capsys.readouterr().err


# -- Slurm ------------------------------------------------------------------------

_FAKE_SRUN = """#!/bin/bash
# A stand-in for srun in a 2-task allocation on 127.0.0.1: starts the
# command once per task with the variables Slurm sets, waits for all.
while [[ "$1" == --* ]]; do shift; done
pids=()
for rank in 0 1; do
  SLURM_PROCID=$rank SLURM_LOCALID=$rank "$@" > "$OUT_DIR/task-$rank.out" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


def test_the_sbatch_script_runs_one_task_per_rank_with_a_consistent_tf_config(tmp_path):
    script = _emit(["--emit=slurm", "--num_workers=2", "--gpus=1", "--time=00:10:00"],
                   command=[sys.executable, "-c",
                            "import os; print(os.environ['TF_CONFIG'])"])
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=1" in script and "#SBATCH --time=00:10:00" in script
    (tmp_path / "job.sbatch").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(_FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT_DIR=str(tmp_path),
               PYTHONPATH=str(REPO), SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="127.0.0.1",
               SLURM_TASKS_PER_NODE="2", SLURM_NTASKS="2", SLURM_NNODES="1")
    done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    configs = [json.loads((tmp_path / f"task-{rank}.out").read_text()) for rank in (0, 1)]
    base = 20000 + 16 * 242  # SLURM_JOB_ID 4242
    for rank, config in enumerate(configs):
        assert config["cluster"] == {"worker": [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]}
        assert config["task"] == {"type": "worker", "index": rank}


def test_a_slurm_task_without_the_slurm_variables_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run([sys.executable, "-m", "tfdist.launch.slurm_task", "--", "true"],
                          env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "SLURM_JOB_NODELIST is not set: not inside a Slurm job step (srun)?" in done.stderr


def test_slurm_job_ids_get_separate_port_blocks():
    assert slurm_task.base_port({"SLURM_JOB_ID": "7"}) == 20112
    assert slurm_task.base_port({"SLURM_JOB_ID": "1007"}) == 20112  # ids equal mod 1000 share
    with pytest.raises(ConfigurationError, match=r"SLURM_JOB_ID \('abc'\) is not a number"):
        slurm_task.base_port({"SLURM_JOB_ID": "abc"})
