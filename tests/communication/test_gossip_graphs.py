"""Mixing matrices and pair rounds of `tfdist.communication.gossip_graphs`,
against their definitions (no TensorFlow)."""

import itertools

import numpy as np
import pytest

from tfdist.communication import gossip_graphs
from tfdist.errors import ConfigurationError


@pytest.mark.parametrize("topology", gossip_graphs.TOPOLOGIES)
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 5, 8])
def test_every_named_topology_is_doubly_stochastic_and_its_rounds_are_matchings(
        topology, replicas):
    for matrix in gossip_graphs.matrices(topology, replicas):
        np.testing.assert_allclose(matrix.sum(axis=0), 1.0)
        np.testing.assert_allclose(matrix.sum(axis=1), 1.0)
        rounds = gossip_graphs.pair_rounds(matrix)
        for pairs in rounds:  # no replica in two pairs of one round
            members = [replica for pair in pairs for replica in pair]
            assert len(members) == len(set(members)), pairs
        linked = {(i, j) for i, j in itertools.combinations(range(replicas), 2)
                  if matrix[i, j] or matrix[j, i]}
        assert sorted(pair for pairs in rounds for pair in pairs) == sorted(linked)


def test_the_ring_averages_each_replica_with_its_two_neighbours():
    matrix = gossip_graphs.matrices("ring", 5)[0]
    assert np.count_nonzero(matrix[2]) == 3
    np.testing.assert_allclose(matrix[2, [1, 2, 3]], 1 / 3)
    np.testing.assert_allclose(matrix[0, [4, 0, 1]], 1 / 3)
    # Each replica exchanges with 2 neighbours: 3 rounds on an odd ring.
    assert len(gossip_graphs.pair_rounds(matrix)) == 3
    assert [len(gossip_graphs.neighbours_in_order(matrix, r)) for r in range(5)] == [2] * 5


def test_the_one_peer_exponential_graph_averages_exactly_in_log2_n_steps():
    """Ying et al. 2021: with N a power of 2, the product of the log2(N)
    one-peer matrices is the uniform average."""
    matrices = gossip_graphs.matrices("exponential", 8)
    assert len(matrices) == 3
    for k, matrix in enumerate(matrices):  # one peer: i takes i + 2^k
        for i in range(8):
            assert set(np.flatnonzero(matrix[i])) == {i, (i + 2 ** k) % 8}
    product = matrices[2] @ matrices[1] @ matrices[0]
    np.testing.assert_allclose(product, np.full((8, 8), 1 / 8))
    values = np.random.RandomState(0).randn(8, 5)
    mixed = values
    for matrix in matrices:
        mixed = matrix @ mixed
    np.testing.assert_allclose(mixed, np.tile(values.mean(axis=0), (8, 1)), atol=1e-12)


def test_a_given_matrix_is_checked_and_named_where_it_fails():
    good = np.array([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [0.25, 0.25, 0.5]])
    assert np.array_equal(gossip_graphs.matrices(good, 3)[0], good)
    assert len(gossip_graphs.matrices([good, np.eye(3)], 3)) == 2
    with pytest.raises(ConfigurationError, match="3 x 3; the strategy has 4 replicas"):
        gossip_graphs.matrices(good, 4)
    not_doubly = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    with pytest.raises(ConfigurationError, match="column 1 sums to 1.5, not 1"):
        gossip_graphs.matrices(not_doubly, 3)
    with pytest.raises(ConfigurationError, match="mixing matrix 1 has negative"):
        gossip_graphs.matrices([good, good - 0.5 * np.eye(3) * 2], 3)
    with pytest.raises(ConfigurationError, match="not one of"):
        gossip_graphs.matrices("torus", 4)
    with pytest.raises(ConfigurationError, match="shape"):
        gossip_graphs.matrices(np.ones(3), 3)


def test_the_spread_is_the_root_mean_square_distance_to_the_average():
    weights = [np.array([0.0, 0.0]), np.array([2.0, 0.0])]  # average (1, 0): each at 1
    assert gossip_graphs.spread(weights) == pytest.approx(1.0)
    assert gossip_graphs.spread([np.ones(3)] * 4) == 0.0
