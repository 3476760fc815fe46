"""Decentralized SGD (`tfdist.communication.Gossip`) against independent
references: a NumPy simulation of adapt-then-combine D-PSGD (one copy of
a linear model per replica, its gradient written out, the mixing
matrices applied as matrices), and Keras fit on one device for the
complete graph (synchronous SGD). Collectives counted per exchange.
On real workers: tests/scenarios/test_gossip_workers.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tfdist.communication import Gossip, gossip_graphs
from tfdist.errors import ConfigurationError

EXAMPLES, BATCH, EPOCHS = 64, 16, 2  # 4 steps per epoch
FEATURES, OUTPUTS, LR = 3, 2, 0.05


def _data(examples=EXAMPLES):
    rng = np.random.RandomState(0)
    x = rng.randn(examples, FEATURES).astype("float32")
    y = (x @ rng.randn(FEATURES, OUTPUTS) + 0.3 * rng.randn(examples, OUTPUTS)).astype("float32")
    return x, y


def _linear_model(momentum):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
    model.compile(optimizer=keras.optimizers.SGD(LR, momentum=momentum), loss="mse")
    return model


def _numpy_gossip(initial, x, y, matrices, momentum, global_average_every=None, pieces=None,
                  save_every=None):
    """Adapt-then-combine D-PSGD in float64, one copy per replica.

    Replica r steps on piece ``pieces[r]`` (default: r) of each global
    batch, the pieces contiguous (ceil(G / N) rows while they last, as
    tf.distribute splits; across workers of several replicas each, it deals
    the pieces to the workers in turn: tests/scenarios/test_gossip_workers.py) with Keras' SGD
    (m = momentum m - lr g; w += m) on the gradient of its rows' squared
    errors over the global count G, times N; then w_r <- sum_j W[r, j] w_j
    with W = matrices[(t - 1) % period] after step t, or, every
    ``global_average_every`` steps and at each epoch's end, every replica
    takes the average of the weights and of the momenta; so after the
    exchange of every ``save_every``-th step (a checkpoint's save)."""
    replicas = matrices[0].shape[0]
    pieces = list(range(replicas)) if pieces is None else pieces
    weights = [[np.array(w, np.float64) for w in initial] for _ in range(replicas)]
    momenta = [[np.zeros_like(w) for w in weights[0]] for _ in range(replicas)]
    spreads, step = [], 0

    def average():
        for group in (weights, momenta):
            means = [np.mean([group[r][i] for r in range(replicas)], axis=0)
                     for i in range(len(initial))]
            for r in range(replicas):
                group[r] = [m.copy() for m in means]

    for _ in range(EPOCHS):
        for start in range(0, len(x), BATCH):
            xb, yb = x[start:start + BATCH], y[start:start + BATCH]
            size, step = len(xb), step + 1
            chunk = -(-size // replicas)
            for r in range(replicas):
                piece = pieces[r]
                rows = slice(min(piece * chunk, size), min((piece + 1) * chunk, size))
                kernel, bias = weights[r]
                error = xb[rows] @ kernel + bias - yb[rows]  # mse: mean over outputs
                scale = replicas * 2.0 / (OUTPUTS * size)
                gradients = [scale * xb[rows].T @ error, scale * error.sum(axis=0)]
                for i, gradient in enumerate(gradients):
                    momenta[r][i] = momentum * momenta[r][i] - LR * gradient
                    weights[r][i] = weights[r][i] + momenta[r][i]
            if global_average_every and step % global_average_every == 0:
                average()
            else:
                matrix = matrices[(step - 1) % len(matrices)]
                weights = [[sum(matrix[r, j] * weights[j][i] for j in range(replicas))
                            for i in range(len(initial))] for r in range(replicas)]
            if save_every and step % save_every == 0:
                average()
            spreads.append(gossip_graphs.spread([np.concatenate([w.ravel() for w in ws])
                                                 for ws in weights]))
        average()
    return weights[0], spreads


class _Spread(keras.callbacks.Callback):
    """The replicas' consensus distance after every step, and whether
    they agree at each epoch's end."""

    def __init__(self, strategy):
        super().__init__()
        self._strategy, self.after_steps, self.epoch_ends = strategy, [], []

    def _spread(self):
        copies = [self._strategy.experimental_local_results(v.value)
                  for v in self.model.trainable_variables]
        return gossip_graphs.spread([np.concatenate([c[r].numpy().ravel() for c in copies])
                                     for r in range(len(copies[0]))])

    def on_train_batch_end(self, batch, logs=None):
        self.after_steps.append(self._spread())

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(self._spread())


TIME_VARYING = [np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]),
                np.array([[0.6, 0.0, 0.4], [0.0, 1.0, 0.0], [0.4, 0.0, 0.6]])]


@pytest.mark.parametrize("topology,replicas,momentum,global_every", [
    ("ring", 4, 0.0, None),
    ("exponential", 4, 0.9, None),
    ("exponential", 3, 0.0, 3),
    (TIME_VARYING, 3, 0.9, None),
], ids=["ring-4", "exponential-4-momentum", "exponential-3-global3", "given-3-momentum"])
def test_gossip_equals_a_numpy_simulation_of_d_psgd(make_strategy, topology, replicas,
                                                    momentum, global_every):
    x, y = _data()
    strategy = make_strategy(replicas)
    with strategy.scope():
        model = _linear_model(momentum)
    initial = model.get_weights()
    gossip = Gossip(topology, global_average_every=global_every)
    watch = _Spread(strategy)
    tfdist.Trainer(model, strategy, communication=gossip).fit(
        x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[watch])
    expected, spreads = _numpy_gossip(initial, x, y, gossip_graphs.matrices(topology, replicas),
                                      momentum, global_every)
    assert ref.largest_difference(model.get_weights(), expected) < 1e-5
    # Between epoch ends the replicas differ as the simulation's do; at
    # each end they agree (the global average).
    steps = len(x) // BATCH
    np.testing.assert_allclose(
        [s for i, s in enumerate(watch.after_steps) if (i + 1) % steps],
        [s for i, s in enumerate(spreads) if (i + 1) % steps], atol=1e-5)
    exchanged = [s for step, s in enumerate(spreads, 1)
                 if step % steps and not (global_every and step % global_every == 0)]
    assert min(exchanged) > 1e-4
    assert watch.epoch_ends == [0.0] * EPOCHS
    assert gossip.exchanges == EPOCHS * steps - (EPOCHS * steps // global_every
                                                 if global_every else 0)


@pytest.mark.parametrize("via", ["attach", "Trainer"])
def test_the_complete_graph_is_synchronous_sgd_on_one_device(make_strategy, via):
    """Adapt-then-combine on the complete graph, with momentum, on partial
    batches (70 examples, batches of 16 over 3 replicas): Keras fit on one
    device, History included."""
    x, y = _data(70)
    expected = _linear_model(0.9)
    history = expected.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    strategy = make_strategy(3)
    with strategy.scope():
        model = _linear_model(0.9)
    gossip = Gossip("complete")
    if via == "attach":
        tfdist.attach(model, strategy, communication=gossip)
        got = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    else:
        got = tfdist.Trainer(model, strategy, communication=gossip).fit(
            x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    assert ref.largest_difference(model.get_weights(), expected.get_weights()) < 1e-5
    ref.assert_logs_close(history.history, got.history)
    assert gossip.exchanges == EPOCHS * 5


def _ops_everywhere(concrete) -> list:
    """Op types of ``concrete``'s graph and of every function it calls."""
    types = [op.type for op in concrete.graph.get_operations()]
    for function in concrete.graph._functions.values():  # pylint: disable=protected-access
        types += [node.op for node in function.definition.node_def]
    return types


@pytest.mark.parametrize("topology,gathers_per_matrix", [
    ("ring", [2 * 4]), ("exponential", [2 * 4, 1 * 4])])
def test_an_exchange_is_one_pair_gather_per_neighbour_and_no_all_reduce(
        make_strategy, topology, gathers_per_matrix):
    """Per replica per step: one all-gather per neighbour (the ring: 2; the
    exponential graph on 4: 2 at the 1-shift, 1 at the 2-shift, where
    i + 2 and i - 2 are one replica), groups of 2, and no all-reduce."""
    x, y = _data()
    strategy = make_strategy(4)
    with strategy.scope():
        model = _linear_model(0.0)
    gossip = Gossip(topology)
    tfdist.Trainer(model, strategy, communication=gossip).fit(
        x, y, batch_size=BATCH, epochs=1, verbose=0)
    for index, expected in enumerate(gathers_per_matrix):
        concrete = tf.function(lambda index=index: gossip._mix(index)).get_concrete_function()  # pylint: disable=protected-access
        ops = _ops_everywhere(concrete)
        assert ops.count("CollectiveGatherV2") == expected, ops
        assert not [op for op in ops if "Reduce" in op and "Collective" in op], ops
        sizes = {int(tf.get_static_value(op.inputs[1])) for op in concrete.graph.get_operations()
                 if op.type == "CollectiveGatherV2"}
        assert sizes == {2}  # (group size: pairs)


def test_bad_gossip_arguments_are_clear_errors(make_strategy):
    with pytest.raises(ConfigurationError, match="not one of"):
        Gossip("star")
    with pytest.raises(ConfigurationError, match="global_average_every"):
        Gossip(global_average_every=0)
    strategy = make_strategy(3)
    with strategy.scope():
        model = _linear_model(0.0)
    with pytest.raises(ConfigurationError, match="4 x 4; the strategy has 3 replicas"):
        tfdist.Trainer(model, strategy, communication=Gossip(np.full((4, 4), 0.25)))
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                      loss="mse")
    with pytest.raises(ConfigurationError, match="gradient_accumulation_steps=2"):
        tfdist.Trainer(model, strategy, communication=Gossip())
    x, y = _data()
    no_collectives = tfdist.make_strategy("mirrored", num_replicas=2,
                                          communication="reduce_to_one_device")
    with no_collectives.scope():
        model = _linear_model(0.0)
    trainer = tfdist.Trainer(model, no_collectives, communication=Gossip())
    with pytest.raises(ConfigurationError, match="needs TensorFlow's collective ops"):
        trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


@pytest.mark.parametrize("topology,replicas", [
    ("ring", 4), ("exponential", 3), ("exponential", 4), (TIME_VARYING, 3)])
def test_an_exchange_of_rank_valued_weights_gives_the_analytic_averages(
        make_strategy, topology, replicas):
    """Each replica's weights set to its rank r (every entry); after the
    exchange of matrix k, replica i holds sum_j W_k[i, j] j: on a ring of
    4, the mean of (i - 1) mod 4, i and (i + 1) mod 4; one peer, the mean
    of i and (i + 2^k) mod N (not of i - 2^k: the graph is directed, as on
    3 replicas). (At most 4 replicas: the test process's logical CPUs.)"""
    strategy = make_strategy(replicas)
    with strategy.scope():
        model = _linear_model(0.0)
    gossip = Gossip(topology)
    tfdist.Trainer(model, strategy, communication=gossip).fit(
        *_data(), batch_size=BATCH, epochs=1, verbose=0)  # (built and prepared)
    for index, matrix in enumerate(gossip.matrices):
        for variable in model.trainable_variables:  # replica r's copy: all r
            ranks = strategy.experimental_distribute_values_from_function(
                lambda context, v=variable: tf.fill(
                    v.shape, tf.cast(context.replica_id_in_sync_group, v.dtype)))
            strategy.extended.update(variable.value, lambda v, x: v.assign(x), args=(ranks,),
                                     group=False)
        tf.function(lambda index=index: gossip._mix(index))()  # pylint: disable=protected-access
        expected = matrix @ np.arange(replicas)
        for variable in model.trainable_variables:
            copies = [c.numpy() for c in strategy.experimental_local_results(variable.value)]
            for replica, copy in enumerate(copies):
                np.testing.assert_allclose(copy, np.full(copy.shape, expected[replica]),
                                           rtol=1e-6, err_msg=f"replica {replica}")
