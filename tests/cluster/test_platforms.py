"""Vertex AI and SageMaker: the variables each platform sets become a
validated TF_CONFIG, which make_strategy's parse picks up on its own."""

import json
import os

import pytest

from tfdist import cluster
from tfdist.cluster import platforms

VERTEX_CLUSTER = {
    "workerpool0": ["cmle-training-workerpool0-1a2b-0:2222"],
    "workerpool1": ["cmle-training-workerpool1-1a2b-0:2222",
                    "cmle-training-workerpool1-1a2b-1:2222"],
}


def _vertex_env(pool, index, cluster_spec=VERTEX_CLUSTER):
    return {"CLUSTER_SPEC": json.dumps({
        "cluster": cluster_spec, "environment": "cloud",
        "task": {"type": pool, "index": index}, "job": "{...}"})}


@pytest.mark.parametrize("pool, index, job, is_chief", [
    ("workerpool0", 0, "chief", True), ("workerpool1", 1, "worker", False)])
def test_vertex_cluster_spec_becomes_tf_config(monkeypatch, pool, index, job, is_chief):
    monkeypatch.setenv("TF_CONFIG", "")  # (restored after the test)
    for name, value in _vertex_env(pool, index).items():
        monkeypatch.setenv(name, value)
    config = cluster.parse_tf_config()
    assert (config.task_type, config.task_index, config.is_chief) == (job, index, is_chief)
    assert config.num_workers == 3
    assert config.cluster["chief"] == VERTEX_CLUSTER["workerpool0"]
    # Exported for TensorFlow's own cluster resolver.
    assert json.loads(os.environ["TF_CONFIG"])["task"] == {"type": job, "index": index}


def test_vertex_with_parameter_servers():
    spec = dict(VERTEX_CLUSTER, workerpool2=["cmle-training-workerpool2-1a2b-0:2222"])
    config = platforms.from_vertex(_vertex_env("workerpool2", 0, spec))
    assert (config.task_type, sorted(config.cluster)) == ("ps", ["chief", "ps", "worker"])


def test_tf_config_set_by_the_platform_wins(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}))
    monkeypatch.setenv("CLUSTER_SPEC", "not even json")
    assert cluster.parse_tf_config().cluster == {"worker": ["a:1", "b:1"]}


@pytest.mark.parametrize("current, index", [("algo-1", 0), ("algo-2", 1)])
def test_sagemaker_hosts_become_workers(monkeypatch, current, index):
    monkeypatch.setenv("TF_CONFIG", "")  # (restored after the test)
    monkeypatch.delenv("CLUSTER_SPEC", raising=False)
    monkeypatch.setenv("SM_HOSTS", '["algo-2", "algo-1"]')  # any order: sorted
    monkeypatch.setenv("SM_CURRENT_HOST", current)
    config = cluster.parse_tf_config()
    assert config.cluster == {"worker": ["algo-1:2222", "algo-2:2222"]}
    assert (config.task_type, config.task_index) == ("worker", index)


def test_a_single_sagemaker_host_is_no_cluster():
    assert platforms.platform_tf_config({"SM_HOSTS": '["algo-1"]',
                                         "SM_CURRENT_HOST": "algo-1"}) is None


@pytest.mark.parametrize("env, message", [
    ({"CLUSTER_SPEC": "{oops"}, r"CLUSTER_SPEC is not valid JSON .*expected \{\"cluster\""),
    ({"CLUSTER_SPEC": '{"cluster": {}}'}, r"CLUSTER_SPEC .* needs 'cluster' and 'task' objects"),
    (_vertex_env("workerpool7", 0), r"worker pools \['workerpool7'\]; Vertex AI's are workerpool0"),
    (_vertex_env("workerpool1", 0, {"workerpool1": ["h:1"]}), "CLUSTER_SPEC has no 'workerpool0'"),
    ({"SM_HOSTS": "algo-1", "SM_CURRENT_HOST": "algo-1"}, r"SM_HOSTS is not valid JSON"),
    ({"SM_HOSTS": '{"a": 1}', "SM_CURRENT_HOST": "algo-1"},
     r"SM_HOSTS \('\{\"a\": 1\}'\) must be a non-empty JSON list of host names"),
    ({"SM_HOSTS": '["algo-1", "algo-2"]'}, r"SM_CURRENT_HOST is not set: not inside a SageMaker"),
    ({"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-9"},
     r"SM_CURRENT_HOST \('algo-9'\) is not one of SM_HOSTS"),
])
def test_malformed_platform_variables_are_named(env, message):
    with pytest.raises(platforms.PlatformEnvironmentError, match=message):
        platforms.platform_tf_config(env)
