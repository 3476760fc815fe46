"""tfdist-run --emit=trainjob: a Kubeflow Trainer v2 TrainJob and its runtime.

Checked as a cluster would take them: every object against the published
Trainer v2 CRD schema (v2.3.0, strict: unknown fields rejected), and the
pods run for real, each with the environment Kubernetes would give it
(the completion-index annotation, ``$(VAR)`` expansion in order) and the
JobSet's hostnames resolved to 127.0.0.1 ports, as cluster DNS resolves
them to the pods: two workers train and equal one device.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from tfdist import cluster
from tfdist.errors import ConfigurationError
from tfdist.launch import cli, emit, kubeflow
from tests.support import crd_schema
from tests.support import reference as ref

pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

PROGRAM = ["python", "tests/programs/train_reference_mlp.py"]
PUBLISHED_SHA256 = {
    "trainer.kubeflow.org_trainjobs.yaml":
        "a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416",
    "trainer.kubeflow.org_trainingruntimes.yaml":
        "69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f",
}


def _manifests(args, command=("python", "train.py")):
    kind, spec = cli.parse_emit_args(["--emit=trainjob"] + args + ["--"] + list(command))
    return list(yaml.safe_load_all(emit.emit(kind, spec)))


def test_the_schemas_are_the_published_ones():
    assert {name: crd_schema.sha256(text) for name, text in crd_schema.crd_texts().items()} == (
        PUBLISHED_SHA256)


@pytest.mark.parametrize("args", [
    ["--num_workers=3"],
    ["--num_workers=2", "--chief", "--cpu=4", "--memory=16Gi", "--gpus=1"],
    ["--num_workers=2", "--num_ps=2", "--gpus=1", "--restart_policy=Never", "--port=2345"],
], ids=["workers", "chief", "parameter_servers"])
def test_every_object_passes_the_trainer_v2_schema(args):
    runtime, trainjob = _manifests(["--image=repo/train:1", "--name=mnist"] + args)
    assert (runtime["kind"], trainjob["kind"]) == ("TrainingRuntime", "TrainJob")
    for manifest in (runtime, trainjob):
        assert crd_schema.errors(manifest) == [], manifest["kind"]
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "mnist"}


def test_the_schema_check_can_fail():
    runtime, trainjob = _manifests(["--image=img", "--num_workers=2"])
    trainjob["spec"]["trainer"]["numNodes"] = "two"
    trainjob["spec"]["trainer"]["replicas"] = 2  # not a TrainJob field
    del runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"]
    assert any("numNodes" in error for error in crd_schema.errors(trainjob))
    assert any("replicas" in error for error in crd_schema.errors(trainjob))
    assert any("'name' is a required property" in error for error in crd_schema.errors(runtime))


def test_the_worker_job_is_the_one_trainer_fills_in():
    """Trainer v2 puts the TrainJob's image, command, env and numNodes into
    the replicated job labelled as the trainer step, in the container named
    ``node``; the webhook requires both."""
    runtime, trainjob = _manifests(["--image=img", "--num_workers=4", "--gpus=1"])
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    assert node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert [c["name"] for c in node["template"]["spec"]["template"]["spec"]["containers"]] == [
        "node"]
    assert "mlPolicy" in runtime["spec"]  # resourcesPerNode applies only with one
    trainer = trainjob["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["command"] == ["python", "train.py"]
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 1}}


def _expand(env, index):
    """A container's environment as Kubernetes makes it: ``fieldRef`` to
    the completion-index annotation, then ``$(NAME)`` of earlier entries."""
    values = {}
    for entry in env:
        if "valueFrom" in entry:
            assert entry["valueFrom"] == {"fieldRef": {"fieldPath": kubeflow.COMPLETION_INDEX}}
            values[entry["name"]] = str(index)
        else:
            values[entry["name"]] = re.sub(
                r"\$\((\w+)\)", lambda match: values.get(match.group(1), match.group(0)),
                entry["value"])
    return values


def _pods(runtime, trainjob):
    """[(role, index, command, env)] for every pod the JobSet would start."""
    pods = []
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if job["name"] == "node":
            count, command = trainjob["spec"]["trainer"]["numNodes"], trainjob["spec"]["trainer"][
                "command"]
            env = trainjob["spec"]["trainer"]["env"]
        else:
            count = job["template"]["spec"]["parallelism"]
            (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
            command, env = container["command"], container["env"]
        for index in range(count):
            pods.append((job["name"], index, command, _expand(env, index)))
    return pods


def test_each_pod_gets_a_tf_config_naming_its_own_hostname():
    runtime, trainjob = _manifests(["--image=img", "--name=job", "--num_workers=2",
                                    "--num_ps=1"])
    tasks = {}
    for role, index, command, env in _pods(runtime, trainjob):
        config = cluster.from_tfjob({"TF_CONFIG": env["TF_CONFIG"]})
        tasks[(role, index)] = (config.task_type, config.task_index, command)
        hostname = f"job-{role}-0-{index}.job:2222"  # the JobSet's <job>-<rjob>-0-<i>.<job>
        assert json.loads(env["TF_CONFIG"])["cluster"][config.task_type][index] == hostname
    assert tasks == {
        ("chief", 0): ("chief", 0, ["python", "train.py"]),
        ("ps", 0): ("ps", 0, ["python", "-m", "tfdist.server"]),
        ("node", 0): ("worker", 0, ["python", "-m", "tfdist.server"]),
        ("node", 1): ("worker", 1, ["python", "-m", "tfdist.server"]),
    }
    success = runtime["spec"]["template"]["spec"]["successPolicy"]
    assert success == {"operator": "Any", "targetReplicatedJobs": ["chief"]}


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def test_the_emitted_pods_train_two_workers_like_one_device(tmp_path):
    out = tmp_path / "out"
    runtime, trainjob = _manifests(["--image=img", "--name=mnist", "--num_workers=2"],
                                   command=PROGRAM + [f"--output_dir={out}", "--epochs=2"])
    pods = _pods(runtime, trainjob)
    hostnames = json.loads(pods[0][3]["TF_CONFIG"])["cluster"]["worker"]
    resolved = dict(zip(hostnames, (f"127.0.0.1:{port}" for port in _free_ports(2))))
    processes = []
    try:
        for _, _, command, env in pods:
            tf_config = env["TF_CONFIG"]
            for hostname, address in resolved.items():
                tf_config = tf_config.replace(hostname, address)
            processes.append(subprocess.Popen(
                [sys.executable if part == "python" else part for part in command],
                env={**os.environ, **env, "TF_CONFIG": tf_config}, start_new_session=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [process.communicate(timeout=300)[0] for process in processes]
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(30)
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    model, history = ref.keras_fit(ref.global_batches(70, 16), 2, "adam")
    for index in range(2):
        result = json.loads((out / f"worker-{index}.json").read_text())
        for expected, actual in zip(model.get_weights(), result["weights"]):
            np.testing.assert_allclose(np.asarray(actual), expected, atol=1e-5, rtol=0)
        ref.assert_logs_close(history, result["history"])


@pytest.mark.parametrize("args, message", [
    (["--num_workers=2"], "`--emit=trainjob` needs `--image=IMAGE`"),
    (["--image=i", "--num_workers=2", "--restart_policy=ExitCode"],
     r"`--restart_policy` \('ExitCode'\) must be OnFailure or Never for `--emit=trainjob`"),
    (["--image=i", "--num_workers=2", "--name=MyJob"],
     r"`--name` \('MyJob'\) must be lower-case letters"),
    (["--image=i", "--num_workers=2", "--name=9lives"], r"`--name` \('9lives'\)"),
    (["--image=i", "--num_workers=12", "--name=" + "a" * 54],
     r"is too long for `--emit=trainjob`: the hostname 'a+-node-0-11' has 64 characters"),
])
def test_bad_trainjob_arguments_are_named(args, message):
    with pytest.raises(ConfigurationError, match=message):
        _manifests(args)


def test_help_says_kubeflow_deprecated_tfjob(capsys):
    assert cli.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--emit=trainjob" in text and "Kubeflow deprecated TFJob" in text
