"""`tfdist.cluster.training_process`: Horovod's rank, size, local rank and
"rank 0" for every way tfdist runs: without TF_CONFIG (one device,
Mirrored, a TPU's single client), tfdist-run, Slurm, Kubeflow pods, a chief
plus workers, parameter servers. The launcher's own case (2 workers on
127.0.0.1) runs for real in tests/scenarios/test_horovod_port.py."""

import json

import pytest

from tfdist import cluster
from tfdist.cluster import TrainingProcess
from tfdist.errors import ConfigurationError


def _every_task(cluster_spec):
    return {f"{job}-{index}": cluster.build_tf_config(cluster_spec, job, index)
            for job, addresses in cluster_spec.items() for index in range(len(addresses))}


def test_without_tf_config_one_process_is_the_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.training_process() == TrainingProcess(0, 1, 0, 1, True)


def test_tfdist_run_workers_share_one_host(monkeypatch):
    spec = {"worker": ["127.0.0.1:4000", "127.0.0.1:4001", "127.0.0.1:4002"]}
    monkeypatch.setenv("TF_CONFIG", cluster.build_tf_config(spec, "worker", 2).to_json())
    assert cluster.training_process() == TrainingProcess(2, 3, 2, 3, False)


def test_a_chief_comes_first_and_hosts_group_local_ranks():
    spec = {"chief": ["a:1"], "worker": ["a:2", "b:1", "b:2", "c:1"]}
    found = {name: cluster.training_process(config) for name, config in
             _every_task(spec).items()}
    assert {name: (p.rank, p.local_rank, p.local_size, p.is_chief) for name, p in
            found.items()} == {
        "chief-0": (0, 0, 2, True), "worker-0": (1, 1, 2, False),
        "worker-1": (2, 0, 2, False), "worker-2": (3, 1, 2, False),
        "worker-3": (4, 0, 1, False)}
    assert {p.size for p in found.values()} == {5}


def test_slurm_tasks_two_per_node():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x2)"}
    found = [cluster.training_process(cluster.from_slurm({**env, "SLURM_PROCID": str(rank)}))
             for rank in range(4)]
    assert [(p.rank, p.local_rank, p.local_size) for p in found] == [
        (0, 0, 2), (1, 1, 2), (2, 0, 2), (3, 1, 2)]
    assert [p.is_chief for p in found] == [True, False, False, False]


def test_kubeflow_pods_are_one_per_host():
    hosts = [f"job-node-0-{i}.job:2222" for i in range(3)]
    tf_config = json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": 1}})
    assert cluster.training_process(cluster.from_tfjob({"TF_CONFIG": tf_config})) == (
        TrainingProcess(1, 3, 0, 1, False))


def test_ipv6_addresses_group_by_host():
    spec = {"worker": ["[::1]:4000", "[::1]:4001"]}
    assert cluster.training_process(cluster.build_tf_config(spec, "worker", 1)) == (
        TrainingProcess(1, 2, 1, 2, False))


def test_parameter_servers_the_coordinator_is_the_one_process():
    spec = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
    tasks = _every_task(spec)
    assert cluster.training_process(tasks["chief-0"]) == TrainingProcess(0, 1, 0, 1, True)
    with pytest.raises(ConfigurationError, match=r"worker-1, is not a training process: it "
                                                 r"runs `python -m tfdist.server`"):
        cluster.training_process(tasks["worker-1"])


def test_an_evaluator_is_named():
    config = cluster.build_tf_config({"worker": ["h:1"], "evaluator": ["h:9"]}, "evaluator", 0)
    with pytest.raises(ConfigurationError, match="evaluator-0, is not a training process: it "
                                                 "evaluates beside training"):
        cluster.training_process(config)


@pytest.mark.parametrize("num_replicas", [1, 2], ids=["one_device", "mirrored"])
def test_single_process_strategies_agree_with_the_strategy(num_replicas, make_strategy,
                                                           monkeypatch):
    """Without TF_CONFIG the chief is the process TensorFlow itself saves from."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = make_strategy(num_replicas)
    process = cluster.training_process()
    assert process.is_chief == strategy.extended.should_checkpoint
    assert (process.rank, process.size) == (0, 1)
