"""tfdist.cluster: each TF_CONFIG mistake gets its own message; resolvers."""

import json

import pytest

from tfdist import cluster, errors

GOOD = {"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
        "task": {"type": "worker", "index": 1}}


def _with(**changes):
    config = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        target = config
        *parents, leaf = path.split("__")
        for key in parents:
            target = target[key]
        target[leaf] = value
    return json.dumps(config)


def test_good_config_and_helpers(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(GOOD))
    assert cluster.task_type() == "worker" and cluster.task_id() == 1
    assert cluster.num_workers() == 2 and not cluster.is_chief()
    assert cluster.parse_tf_config().address == "127.0.0.1:2223"


def test_without_tf_config_a_single_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.parse_tf_config() is None
    assert cluster.is_chief() and cluster.num_workers() == 1 and cluster.task_id() == 0


def test_chief_job_is_the_chief():
    config = cluster.build_tf_config(
        {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}, "chief", 0
    )
    assert config.is_chief and config.num_workers == 2
    assert json.loads(config.to_json())["task"] == {"type": "chief", "index": 0}


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"cluster": {"worker": ["a:1"]', "not valid JSON .*line 1"),
        ("[1, 2]", "must be a JSON object"),
        (_with(cluster={}), "'cluster' must be a non-empty object"),
        (_with(cluster={"workers": ["a:1"]}), "unknown job name 'workers'"),
        (_with(cluster__worker="a:1"), "cluster.worker must be a non-empty list"),
        (_with(cluster__worker=["a:1", "a:1"]), "address 'a:1' is used twice"),
        (_with(cluster__worker=["a:1", "localhost"]), r"cluster.worker\[1\] \('localhost'\) is not a 'host:port'"),
        (_with(cluster__worker=["a:1", "a:99999"]), "port 99999, outside 1-65535"),
        (_with(cluster__worker=["a:1", 7]), r"cluster.worker\[1\] must be a 'host:port' string"),
        (_with(cluster={"chief": ["a:1", "a:2"], "worker": ["a:3"]}), "cluster.chief may have one task"),
        (_with(task__type="master"), r"task.type \('master'\) must be one of"),
        (_with(task__type="ps"), r"task.type \('ps'\) is not a job in 'cluster'"),
        (_with(task__index=2), r"task.index \(2\) is out of range for job 'worker' with 2"),
        (_with(task__index="1"), r"task.index \('1'\) must be an integer"),
        (_with(task="worker"), "'task' must be an object"),
    ],
)
def test_each_mistake_has_its_own_message(text, message):
    with pytest.raises(errors.TFConfigError, match=message):
        cluster.parse_tf_config(text)


def test_ipv6_addresses_are_accepted():
    config = cluster.build_tf_config({"worker": ["[::1]:2222"]}, "worker", 0)
    assert config.address == "[::1]:2222"


def test_slurm_nodelist_expansion():
    assert cluster.expand_slurm_nodelist("node[01-03,07],gpu5,c[8-9]") == [
        "node01", "node02", "node03", "node07", "gpu5", "c8", "c9"]


def test_from_slurm_on_a_recorded_environment():
    # Recorded from `srun -N2 --ntasks-per-node=2 env | grep SLURM` (trimmed).
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "tpu-node[3-4]",
        "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    }
    config = cluster.from_slurm(env, base_port=20000)
    assert config.cluster == {"worker": [
        "tpu-node3:20000", "tpu-node3:20001", "tpu-node4:20000", "tpu-node4:20001"]}
    assert config.task_index == 3 and not config.is_chief


def test_from_slurm_outside_slurm_is_a_clear_error():
    with pytest.raises(errors.TFConfigError, match="SLURM_JOB_NODELIST is not set"):
        cluster.from_slurm({})


def test_from_tfjob_on_a_recorded_environment():
    # As the Kubeflow training operator sets it for worker 1 of a TFJob.
    env = {"TF_CONFIG": json.dumps({
        "cluster": {
            "chief": ["mnist-chief-0.default.svc:2222"],
            "worker": ["mnist-worker-0.default.svc:2222", "mnist-worker-1.default.svc:2222"],
        },
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    })}
    config = cluster.from_tfjob(env)
    assert config.address == "mnist-worker-1.default.svc:2222"
    assert config.num_workers == 3 and not config.is_chief
