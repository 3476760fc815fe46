"""`tfdist._internal.flat_pieces`: a flat run of elements as rectangles,
against NumPy on every run of small shapes up to rank 4."""

import itertools
import math

import numpy as np
import pytest

from tfdist._internal import flat_pieces

SHAPES = [(7,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (1, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_run_is_covered_by_its_rectangles_once_in_order(shape):
    size = math.prod(shape)
    whole = np.arange(size).reshape(shape)
    for start, stop in itertools.combinations(range(size + 1), 2):
        covered = np.zeros(shape, int)
        flat_start = start
        found = flat_pieces.pieces(shape, start, stop)
        assert len(found) <= 2 * len(shape) - 1, (shape, start, stop, found)
        for piece in found:
            region = tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.lengths))
            # Each rectangle is the next stretch of the run, in flat order.
            assert piece.start == flat_start, (shape, start, stop, piece)
            np.testing.assert_array_equal(
                whole[region], np.arange(piece.start, piece.stop).reshape(piece.lengths))
            covered[region] += 1
            flat_start = piece.stop
        assert flat_start == stop
        expected = np.zeros(size, int)
        expected[start:stop] = 1
        np.testing.assert_array_equal(covered.reshape(-1), expected)


def test_an_empty_run_has_no_pieces_and_a_scalar_is_refused():
    assert flat_pieces.pieces((3, 4), 5, 5) == []
    with pytest.raises(ValueError, match="saved whole"):
        flat_pieces.pieces((), 0, 1)


def test_the_spec_is_tensorflows_slice_spec():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    piece = flat_pieces.pieces((3, 4), 5, 8)[0]
    assert piece.spec == "3 4 1,1:1,3"
    values = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4])
    written = tf.io.gfile.join(__import__("tempfile").mkdtemp(), "s")
    tf.raw_ops.SaveV2(prefix=written, tensor_names=["w"], shape_and_slices=[""],
                      tensors=[values])
    read = tf.raw_ops.RestoreV2(prefix=written, tensor_names=["w"],
                                shape_and_slices=[piece.spec], dtypes=[tf.float32])[0]
    np.testing.assert_array_equal(read.numpy(), [[5., 6., 7.]])
