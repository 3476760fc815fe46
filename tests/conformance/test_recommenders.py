"""The recommender corpus (`tests.support.recommenders`: a two-tower
retrieval model, DCN and DLRM, as users write them with ``model.fit``)
against the same program on one device with plain Keras: History
(loss, accuracy, AUC), weights, ``evaluate`` and ``predict`` to 1e-5.

Places: ``sharded_3``, the tables sharded by vocabulary over 3 replicas
(``FullySharded``: ids routed to their rows' owners,
`tfdist.communication.table_lookups`), the last batch of 5 leaving one
replica a single example; ``replicated_2``, the tables whole on 2
replicas, the step reading only the rows it uses
(`tfdist.replica.table_rows`); ``workers``, 2 real workers x 2 replicas
under ``tfdist-run`` with the tables sharded over the cluster's 4
replicas. Optimizers: SGD with momentum, Adagrad and Adam (sparse
updates whose squares are of each occurrence's entry).

CI runs the two-tower model sharded, DCN replicated and DCN on workers;
``--conformance=full`` runs every family at every place, and DLRM's
checkpoints in the Keras form and across replica counts.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import recommenders
from tests.support import reference as ref

pytestmark = pytest.mark.conformance

FAMILIES = (("two_tower", "adam"), ("dcn", "adagrad"), ("dlrm", "momentum"))
PLACES = {"sharded_3": (3, tfdist.communication.FullySharded),
          "replicated_2": (2, lambda: None)}


def _one_device(name: str, optimizer: str, x, y):
    expected = recommenders.FAMILIES[name].build(optimizer)
    history = expected.fit(x, y, batch_size=recommenders.BATCH, epochs=2, shuffle=False,
                           verbose=0)
    return expected, history


def _attached(name: str, optimizer: str, replicas: int, communication):
    strategy = tfdist.make_strategy("mirrored", num_replicas=replicas)
    with strategy.scope():
        model = recommenders.FAMILIES[name].build(optimizer)
    return tfdist.attach(model, strategy, communication=communication)


IN_CI = {("two_tower", "sharded_3"), ("dcn", "replicated_2")}  # (DCN on workers, below)


@pytest.mark.parametrize("name,optimizer,place", [
    pytest.param(name, optimizer, place, id=f"{name}-{place}",
                 marks=[] if (name, place) in IN_CI else [pytest.mark.conformance_full])
    for name, optimizer in FAMILIES for place in PLACES])
def test_recommender_equals_one_device(name, optimizer, place):
    family = recommenders.FAMILIES[name]
    x, y = family.data()
    expected, expected_history = _one_device(name, optimizer, x, y)
    replicas, communication = PLACES[place]
    model = _attached(name, optimizer, replicas, communication())
    history = model.fit(x, y, batch_size=recommenders.BATCH, epochs=2, shuffle=False, verbose=0)
    ref.assert_logs_close(expected_history.history, history.history)
    ref.assert_weights_close(expected, model)
    ref.assert_evaluates_and_predicts_alike(expected, model, x, y, recommenders.BATCH)
    slices = [[c.shape.num_elements() for c in model.get_layer(table).embeddings.value.values]
              for table in family.tables]
    if place == "sharded_3":  # (each replica: a third of each table's rows, padded)
        assert all(len(set(shares)) == 1 and len(shares) == 3 for shares in slices), slices
        whole = [model.get_layer(table).embeddings.shape.num_elements()
                 for table in family.tables]
        assert all(shares[0] < total for shares, total in zip(slices, whole)), (slices, whole)


@pytest.mark.conformance_full  # (CI: test_table_lookups' save and restore across counts)
def test_a_sharded_recommender_saves_in_the_keras_form_and_resumes_on_another_count(tmp_path):
    """DLRM sharded over 3 replicas: ``model.save`` holds whole tables
    that plain Keras loads and predicts with; its checkpoint restores
    into 2 replicas' slices, which then train on as one device does."""
    x, y = recommenders.FAMILIES["dlrm"].data(1)
    expected, _ = _one_device("dlrm", "adam", x, y)
    model = _attached("dlrm", "adam", 3, tfdist.communication.FullySharded())
    model.fit(x, y, batch_size=recommenders.BATCH, epochs=2, shuffle=False, verbose=0)
    model.save(tmp_path / "dlrm.keras")
    loaded = keras.models.load_model(tmp_path / "dlrm.keras")
    ref.assert_weights_close(expected, loaded)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected.predict(x, verbose=0),
                               atol=1e-5)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt"))
    moved = _attached("dlrm", "adam", 2, tfdist.communication.FullySharded())
    moved.fit(x, y, batch_size=recommenders.BATCH, epochs=1, shuffle=False, verbose=0)
    ref.restore_into(moved, path)
    ref.assert_weights_close(expected, moved)
    ref.assert_train_on_alike([expected, moved], x, y, recommenders.BATCH)


@pytest.mark.parametrize("name,optimizer", [  # (CI: DCN)
    pytest.param(name, optimizer, marks=[] if name == "dcn" else [pytest.mark.conformance_full])
    for name, optimizer in FAMILIES])
def test_recommender_on_two_workers_equals_one_device(tmp_path, name, optimizer):
    """2 MultiWorkerMirroredStrategy workers x 2 replicas (real ``tfdist-run``
    processes on 127.0.0.1, `tests/programs/sharded_tables_per_worker.py`):
    ids and rows cross between the processes, and every worker ends at
    one device's History, weights, evaluation and predictions."""
    family = recommenders.FAMILIES[name]
    x, y = family.data()
    expected, expected_history = _one_device(name, optimizer, x, y)
    for result in recommenders.worker_results(tmp_path / "out", f"--family={name}",
                                              f"--optimizer={optimizer}"):
        ref.assert_worker_result_equals(expected, expected_history, result, x, y,
                                        recommenders.BATCH)
        for table in family.tables:  # (a quarter of the rows on each of this worker's 2)
            rows, width = expected.get_layer(table).embeddings.shape
            assert result["slice_shapes"][table] == [[-(-rows // 4) * width]] * 2
