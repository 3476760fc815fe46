"""Who averages with whom in decentralized SGD: mixing matrices and the
pairs of neighbours that exchange weights.

A mixing matrix ``W`` (N x N, one row and one column per replica) says
what replica ``i`` keeps after an exchange: ``sum_j W[i, j] x_j``, where
``x_j`` is replica ``j``'s weights. Gossip needs ``W`` doubly stochastic
(non-negative, every row and every column summing to 1), so the replicas'
average is kept by every exchange and the replicas' weights contract
towards it (Lian et al., "Can Decentralized Algorithms Outperform
Centralized Algorithms?", NeurIPS 2017; Ying et al., "Exponential Graph
is Provably Efficient for Decentralized Deep Training", NeurIPS 2021).

- ``ring``: each replica with its two neighbours, ``1/3`` each (2
  replicas: ``1/2``);
- ``exponential``: the one-peer exponential graph, time-varying: at step
  ``t`` replica ``i`` takes the half-sum of its weights and replica
  ``i + 2^k``'s (mod N), ``k = t mod ceil(log2 N)``; with N a power of 2,
  ``log2 N`` steps in a row average exactly;
- ``complete``: everyone with everyone, ``1/N``: the global average;
- a matrix, or a list of matrices used in turn (time-varying).

Every pair of replicas that one row or column links exchanges once per
step: `pair_rounds` orders the pairs in rounds where no replica is in two
pairs (a colouring of the graph's edges), the same on every worker, so
exchanges that block cannot wait on each other in a cycle.

>>> from tfdist.communication import gossip_graphs
>>> gossip_graphs.matrices("ring", 4)[0]
array([[0.33333333, 0.33333333, 0.        , 0.33333333],
       [0.33333333, 0.33333333, 0.33333333, 0.        ],
       [0.        , 0.33333333, 0.33333333, 0.33333333],
       [0.33333333, 0.        , 0.33333333, 0.33333333]])
>>> gossip_graphs.pair_rounds(gossip_graphs.matrices("ring", 4)[0])
[[(0, 1), (2, 3)], [(0, 3), (1, 2)]]
>>> [m[0] for m in gossip_graphs.matrices("exponential", 4)]
[array([0.5, 0.5, 0. , 0. ]), array([0.5, 0. , 0.5, 0. ])]
"""

import math
from typing import List, Sequence, Tuple

import numpy as np

from tfdist.errors import ConfigurationError

TOPOLOGIES = ("ring", "exponential", "complete")
_TOLERANCE = 1e-6


def check_name(topology) -> None:
    """Raises, naming the choices, if ``topology`` is a string that is not
    one of `TOPOLOGIES` (matrices are checked once the replicas are known:
    `matrices`)."""
    if isinstance(topology, str) and topology not in TOPOLOGIES:
        raise ConfigurationError(
            f"Gossip topology {topology!r} is not one of {list(TOPOLOGIES)}; or give a "
            "doubly stochastic matrix (N x N, N = replicas) or a list of them.")


def matrices(topology, replicas: int) -> List[np.ndarray]:
    """The mixing matrices of ``topology`` (a name of `TOPOLOGIES`, a
    matrix or a list of matrices) over ``replicas`` replicas, one per step
    of its period; each checked doubly stochastic."""
    if isinstance(topology, str):
        check_name(topology)
        return {"ring": _ring, "exponential": _exponential,
                "complete": _complete}[topology](replicas)
    given = np.asarray(topology, dtype=np.float64)
    if given.ndim == 2:
        given = given[None]
    if given.ndim != 3 or given.shape[0] == 0:
        raise ConfigurationError(
            f"A Gossip topology must be a name, an N x N matrix or a list of them; got an "
            f"array of shape {np.shape(topology)}.")
    return [_checked(matrix, replicas, index) for index, matrix in enumerate(given)]


def _checked(matrix: np.ndarray, replicas: int, index: int) -> np.ndarray:
    where = f"mixing matrix {index}" if index else "the mixing matrix"
    if matrix.shape != (replicas, replicas):
        raise ConfigurationError(
            f"Gossip: {where} is {matrix.shape[0]} x {matrix.shape[1]}; the strategy has "
            f"{replicas} replicas: one row and one column per replica.")
    if not np.all(np.isfinite(matrix)) or np.any(matrix < 0):
        raise ConfigurationError(f"Gossip: {where} has negative or non-finite entries.")
    rows, columns = matrix.sum(axis=1), matrix.sum(axis=0)
    for name, sums in (("row", rows), ("column", columns)):
        bad = np.flatnonzero(np.abs(sums - 1) > _TOLERANCE)
        if bad.size:
            raise ConfigurationError(
                f"Gossip: {where} is not doubly stochastic: {name} {int(bad[0])} sums to "
                f"{sums[bad[0]]:.6g}, not 1 (the replicas' average would drift).")
    return matrix


def _ring(replicas: int) -> List[np.ndarray]:
    matrix = np.zeros((replicas, replicas))
    for i in range(replicas):
        for j in {(i - 1) % replicas, i, (i + 1) % replicas}:
            matrix[i, j] = 1.0
    return [matrix / matrix.sum(axis=1, keepdims=True)]


def _exponential(replicas: int) -> List[np.ndarray]:
    if replicas == 1:
        return [np.ones((1, 1))]
    found = []
    for k in range(math.ceil(math.log2(replicas))):
        matrix = np.eye(replicas) / 2
        for i in range(replicas):
            matrix[i, (i + 2 ** k) % replicas] += 0.5
        found.append(matrix)
    return found


def _complete(replicas: int) -> List[np.ndarray]:
    return [np.full((replicas, replicas), 1.0 / replicas)]


def pair_rounds(matrix: np.ndarray) -> List[List[Tuple[int, int]]]:
    """The pairs ``(i, j)``, ``i < j``, with ``W[i, j]`` or ``W[j, i]``
    non-zero, in rounds where each replica is in at most one pair (greedy
    colouring of the edges, in the pairs' order: the same everywhere)."""
    rounds: List[List[Tuple[int, int]]] = []
    busy: List[set] = []
    replicas = matrix.shape[0]
    for i in range(replicas):
        for j in range(i + 1, replicas):
            if matrix[i, j] == 0 and matrix[j, i] == 0:
                continue
            colour = next((c for c, members in enumerate(busy)
                           if i not in members and j not in members), len(busy))
            if colour == len(busy):
                rounds.append([])
                busy.append(set())
            rounds[colour].append((i, j))
            busy[colour].update((i, j))
    return rounds


def neighbours_in_order(matrix: np.ndarray, replica: int) -> List[Tuple[int, int]]:
    """``replica``'s pairs of `pair_rounds`, in round order."""
    return [pair for pairs in pair_rounds(matrix) for pair in pairs if replica in pair]


def spread(weights: Sequence[np.ndarray]) -> float:
    """The consensus distance: the root mean square, over replicas, of the
    distance between a replica's weights and the replicas' average
    (``weights``: one flat array per replica)."""
    stacked = np.stack([np.asarray(w, dtype=np.float64).ravel() for w in weights])
    return float(np.sqrt(np.mean(np.sum((stacked - stacked.mean(axis=0)) ** 2, axis=1))))
