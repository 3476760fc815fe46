"""Decentralized SGD: each replica steps on its own batches, then averages
its weights with its neighbours in a graph, never with everyone.

An all-reduce makes every worker wait for every other and moves about
twice the gradients' bytes through each; on many machines or a slow
network that decides the speed. In decentralized SGD (D-PSGD, Lian et
al., NeurIPS 2017) replica ``i`` keeps its own weights ``x_i``, and after
each local step takes ``sum_j W[i, j] x_j`` over its neighbours ``j``
(`tfdist.communication.gossip_graphs`: a ring, the one-peer exponential
graph, or a doubly stochastic matrix of your own). Each replica sends
its weights once per neighbour per step (2 for a ring, 1 or 2 for the
exponential graph), whatever the number of replicas, and waits only for
its neighbours.

- **Adapt, then combine.** A step applies the replica's own gradient
  with its own optimizer state (as `tfdist.communication.LocalSGD` does),
  then the replica combines its new weights with its neighbours' new
  weights: ``x_i <- sum_j W[i, j] (x_j - lr g_j)``. Chosen over combining
  first (Lian et al.'s form, the gradient at the weights before the
  exchange) because the step stays Keras' own, any optimizer included,
  and the exchange is one operation on weights after it; and because on
  the complete graph (``W = 1/N``) it is synchronous SGD exactly, with
  or without momentum: the average of the replicas' momentum updates is
  the momentum update of the averaged gradient.
- **What is exchanged**: the trainable weights. Each replica keeps its
  own optimizer state (momentum, Adam's moments).
- **Global averages**: where one model must exist, the replicas average
  everything (weights and optimizer state, one all-reduce): at the end of
  every epoch, before every checkpoint save (so a checkpoint holds the
  average and a resume equals the uninterrupted run, which averages at
  the same steps), and every ``global_average_every`` steps if given.
  The model after `fit` is the replicas' average; the chief writes it.
- **How**: one all-gather of 2 members per pair of neighbours per step,
  all of a replica's weights in one flat tensor of each dtype, each pair
  its own collective group, pairs in rounds where no replica is in two
  (the same order on every worker: no cycle of waits). Each exchange is
  bounded by the strategy's collective timeout, and TensorFlow's error
  when one fails names the op ``gossip_replica_<i>_with_replica_<j>``.

Refused, with the reason: parameter servers and TPUs, gradient
accumulation, and ``Compression`` with it (as for `LocalSGD`).

>>> import keras, numpy as np, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=4)
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
...     model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
>>> gossip = tfdist.communication.Gossip("ring")
>>> trainer = tfdist.Trainer(model, strategy, communication=gossip)
>>> x = np.random.RandomState(0).randn(64, 3).astype("float32")
>>> _ = trainer.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
>>> gossip.exchanges, gossip.averagings   # 4 steps; the epoch's end averages
(4, 1)
"""

from typing import Optional

import tensorflow as tf

from tfdist._internal import collectives
from tfdist.communication import gossip_graphs
from tfdist.communication.local_sgd import LocalSGD
from tfdist.errors import ConfigurationError


class Gossip(LocalSGD):
    """Decentralized SGD over a graph of replicas (module doc).

    Args:
      topology: ``"ring"``, ``"exponential"`` (one-peer, time-varying),
        ``"complete"``, an N x N doubly stochastic matrix (N: the
        strategy's replicas) or a list of them, used in turn.
      global_average_every: also average every replica's weights and
        optimizer state every this many steps (None: only at epoch ends
        and saves).
    """

    def __init__(self, topology="ring", global_average_every: Optional[int] = None):
        if global_average_every is not None and (
                not isinstance(global_average_every, int)
                or isinstance(global_average_every, bool) or global_average_every < 1):
            raise ConfigurationError(
                f"`global_average_every` ({global_average_every!r}) must be None or a "
                "positive integer: the steps between two global averages.")
        gossip_graphs.check_name(topology)
        super().__init__(every_steps=1)
        self.topology, self.global_average_every = topology, global_average_every
        self.matrices = None  # per step of the period, once attached
        self._groups = None  # per matrix: this process's replicas' pairs
        self._exchanges = None

    def __repr__(self) -> str:
        topology = self.topology if isinstance(self.topology, str) else "<matrix>"
        return f"Gossip({topology!r}, global_average_every={self.global_average_every})"

    def attach_to(self, model, strategy: tf.distribute.Strategy) -> None:
        """`LocalSGD.attach_to` (local steps), and the mixing matrices for
        the strategy's replicas (checked)."""
        self.matrices = gossip_graphs.matrices(self.topology, strategy.num_replicas_in_sync)
        super().attach_to(model, strategy)

    def prepare(self, model) -> dict:
        """`LocalSGD.prepare`, and one collective group per pair of
        neighbours, asked for in the same order on every worker."""
        if self._exchanges is not None:
            return self.state()
        state = super().prepare(model)
        strategy = self._strategy
        devices = collectives.replica_devices(strategy)
        local = set(collectives.local_replica_ids(strategy))
        self._groups = []
        for matrix in self.matrices:
            launchers = {}
            for rounds in gossip_graphs.pair_rounds(matrix):
                for pair in rounds:  # every pair, this process's or not: the keys' order
                    members = [devices[replica] for replica in pair]
                    collectives.subgroup_launcher(strategy, members, None)
                    for position, replica in enumerate(pair):
                        if replica in local:
                            launchers[(pair, replica)] = collectives.subgroup_launcher(
                                strategy, members, position)
            if any(launcher is None for launcher in launchers.values()):
                raise ConfigurationError(
                    f"{self!r} needs TensorFlow's collective ops between replicas "
                    "(MultiWorkerMirroredStrategy, or MirroredStrategy on CPUs with "
                    "communication='auto'); this strategy reduces otherwise.")
            self._groups.append(launchers)
        self._exchanges = tf.Variable(0, dtype=tf.int64, trainable=False, name="exchanges")
        return state

    @property
    def exchanges(self) -> int:
        """How many steps ended with an exchange between neighbours."""
        return 0 if self._exchanges is None else int(self._exchanges.numpy())

    def after_step(self) -> None:
        """Cross-replica, after each step: the exchange with the
        neighbours, or a global average when one is due."""
        iterations = tf.cast(self._optimizer.iterations, tf.int64)
        self._since.assign_add(1)
        if self.global_average_every is None:
            self._exchange(iterations)
            return
        due = iterations % self.global_average_every == 0
        tf.cond(due, self._average, lambda: self._exchange(iterations))

    def _exchange(self, iterations) -> None:
        period = len(self.matrices)
        if period == 1:
            self._mix(0)
        else:
            branches = [lambda k=k: self._mixed(k) for k in range(period)]
            tf.switch_case(tf.cast((iterations - 1) % period, tf.int32), branches)
        self._exchanges.assign_add(1)

    def _mixed(self, index: int) -> tf.Tensor:
        self._mix(index)
        return tf.constant(0)

    def _mix(self, index: int) -> None:
        """Every replica's weights become ``sum_j W[i, j] x_j`` (matrix
        ``index``), from one all-gather per pair of neighbours."""
        matrix, launchers = self.matrices[index], self._groups[index]
        strategy, variables = self._strategy, self._variables
        if strategy.num_replicas_in_sync == 1:
            return

        @tf.autograph.experimental.do_not_convert
        def replica_mix():
            context = tf.distribute.get_replica_context()
            replica = int(tf.get_static_value(context.replica_id_in_sync_group))
            own = [tf.identity(v) for v in variables]
            flat = _flat_by_dtype(own)
            mixed = {dtype: tf.cast(matrix[replica, replica], dtype) * value
                     for dtype, value in flat.items()}
            for pair in gossip_graphs.neighbours_in_order(matrix, replica):
                other = pair[1] if pair[0] == replica else pair[0]
                launcher = launchers[(pair, replica)]
                for dtype, value in flat.items():
                    # (rows in the order of the pair's devices: TensorFlow
                    # ranks a group's members by job, task and device index,
                    # the order of the replicas' ids; the scope names the
                    # neighbour in TensorFlow's error if the exchange fails)
                    with tf.name_scope(f"gossip_replica_{replica}_with_replica_{other}"):
                        both = collectives.all_gather_rows(launcher, value[None])
                    weight = matrix[replica, other]
                    if weight:
                        mixed[dtype] += tf.cast(weight, dtype) * both[pair.index(other)]
            return _unflat_by_dtype(mixed, own)

        per_replica = strategy.run(replica_mix)
        for variable, value in zip(variables, per_replica):
            strategy.extended.update(variable, lambda v, x: v.assign(x), args=(value,),
                                     group=False)


def _flat_by_dtype(values) -> dict:
    """``{dtype: one flat tensor}`` of ``values`` (in their order)."""
    flat = {}
    for value in values:
        flat.setdefault(value.dtype, []).append(tf.reshape(value, [-1]))
    return {dtype: tf.concat(parts, 0) for dtype, parts in flat.items()}


def _unflat_by_dtype(flat: dict, like) -> list:
    """The inverse of `_flat_by_dtype`: tensors shaped as ``like``."""
    offsets, values = {dtype: 0 for dtype in flat}, []
    for value in like:
        size, start = value.shape.num_elements(), offsets[value.dtype]
        values.append(tf.reshape(flat[value.dtype][start:start + size], value.shape))
        offsets[value.dtype] = start + size
    return values
