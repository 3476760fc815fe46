"""The tf.data service (`tfdist.data.service`): the global batches come from
a real dispatcher and worker, in order, so training equals one device;
what cannot be honoured is a clear error. The 2-worker run under
``tfdist-run --data_service_workers=1``: tests/scenarios/test_multi_worker.py."""

import subprocess
import sys

import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.data import service
from tfdist.errors import ConfigurationError
from tfdist.launch import LaunchConfig
from tfdist.launch.launcher import make_tasks


_SERVERS = []


@pytest.fixture(scope="module")
def dispatcher():
    """A dispatcher and one worker in this process. They serve until the
    process ends: stopped earlier, the iterators still open (a Trainer's)
    would wait for them when freed."""
    server = tf.data.experimental.service.DispatchServer()
    worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(server.target.split("://")[1]))
    _SERVERS.extend([server, worker])
    return server.target


def _reads_the_service(distributed_or_dataset) -> bool:
    dataset = getattr(distributed_or_dataset, "_original_dataset", distributed_or_dataset)
    return b"DataServiceDataset" in dataset._as_serialized_graph().numpy()  # pylint: disable=protected-access


def test_addresses_and_auto():
    assert service.resolve(None) is None
    assert service.resolve("10.0.0.2:5050") == "grpc://10.0.0.2:5050"
    assert service.resolve("grpc://h:1") == "grpc://h:1"
    for bad in ("", "http://h:1", "no-port", 5050):
        with pytest.raises(ConfigurationError, match="data_service"):
            service.resolve(bad)


def test_auto_reads_the_launchers_variable(monkeypatch):
    monkeypatch.delenv(service.ADDRESS_ENV, raising=False)
    assert service.resolve("auto") is None
    monkeypatch.setenv(service.ADDRESS_ENV, "grpc://127.0.0.1:7")
    assert service.resolve("auto") == "grpc://127.0.0.1:7"


def test_several_service_workers_are_refused_for_a_synchronous_strategy(
        make_strategy, dispatcher, monkeypatch):
    monkeypatch.setenv(service.WORKERS_ENV, "2")
    with pytest.raises(ConfigurationError, match="takes one tf.data service worker.*is 2"):
        tfdist.data.distribute(make_strategy(2), ref.global_batches(20, 8), data_service=dispatcher)


def test_batches_arrive_in_order_and_partial_batches_stay_exact(make_strategy, dispatcher):
    strategy = make_strategy(2)
    dataset = ref.global_batches(70, 16)  # last batch: 6 rows
    through = tfdist.data.distribute(strategy, dataset, data_service=dispatcher, skip_steps=1)
    plain = tfdist.data.distribute(strategy, dataset, skip_steps=1)
    assert _reads_the_service(through) and not _reads_the_service(plain)
    for a, b in zip(through, plain, strict=True):
        for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
            for part_a, part_b in zip(strategy.experimental_local_results(x),
                                      strategy.experimental_local_results(y)):
                assert part_a.numpy().tolist() == part_b.numpy().tolist()


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_trainer_fit_through_the_service_equals_one_device(make_strategy, dispatcher,
                                                          num_replicas):
    dataset = ref.global_batches(70, 16)
    expected, expected_history = ref.keras_fit(dataset, 2, "adam")
    strategy = make_strategy(num_replicas)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    history = tfdist.Trainer(model, strategy, input_pipeline=tfdist.DataOptions(data_service=dispatcher)).fit(
        dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history, history.history)


def test_attached_fit_takes_data_service(make_strategy, dispatcher):
    dataset = ref.global_batches(70, 16)
    expected, _ = ref.keras_fit(dataset, 2, "adam")
    strategy = make_strategy(2)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    tfdist.attach(model, strategy, input_pipeline=tfdist.DataOptions(data_service=dispatcher)).fit(
        dataset, epochs=2, verbose=0)
    ref.assert_weights_close(expected, model)


def test_a_dataset_fn_is_a_clear_error(make_strategy, dispatcher):
    def dataset_fn(context):
        return ref.global_batches(20, 8)

    with pytest.raises(ConfigurationError, match="data_service takes a dataset of global batches"):
        tfdist.data.distribute(make_strategy(2), dataset_fn, data_service=dispatcher)


def test_the_launcher_adds_a_dispatcher_and_workers_and_tells_the_training_tasks(tmp_path):
    config = LaunchConfig(num_workers=2, data_service_workers=2)
    assert config.num_tasks == 5
    tasks = {t.name: t for t in make_tasks(config, [11, 12, 13, 14, 15], str(tmp_path))}
    assert list(tasks) == ["worker-0", "worker-1", "data-dispatcher", "data-worker-0",
                           "data-worker-1"]
    for name in ("worker-0", "worker-1"):
        assert tasks[name].env[service.ADDRESS_ENV] == "grpc://127.0.0.1:13"
        assert tasks[name].env[service.WORKERS_ENV] == "2" and not tasks[name].server
    assert tasks["data-worker-1"].command[-4:] == (
        "data_worker", "--port=15", "--dispatcher=127.0.0.1:13", "--host=127.0.0.1")
    assert all(tasks[n].server and tasks[n].max_respawns == 0
               for n in ("data-dispatcher", "data-worker-0", "data-worker-1"))
    with pytest.raises(ConfigurationError, match=r"`data_service_workers` \(-1\) must be 0"):
        LaunchConfig(num_workers=2, data_service_workers=-1)


def test_a_data_worker_without_its_dispatcher_is_a_clear_error():
    done = subprocess.run([sys.executable, "-m", "tfdist.server", "data_worker", "--port=1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "data_worker needs --dispatcher=HOST:PORT" in done.stderr
