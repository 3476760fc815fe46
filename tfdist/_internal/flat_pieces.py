"""A run of a tensor's elements in flat (row-major) order, as the
rectangular pieces TensorFlow's checkpoint format stores slices in.

Sharded state and fully sharded weights keep each weight as flat slices
(`tfdist.communication.shard_layout.ShardLayout`). A checkpoint stores a
slice of a variable as a hyperrectangle of its shape, named by a slice spec
(``"4 6 1,3:0,6"``: shape 4x6, rows 1-3, every column). A flat run
``[start, stop)`` is at most ``2 * rank - 1`` such rectangles: the rest of
the first row it starts in, the whole rows after it, the start of the last
row; each rectangle is itself a flat run, so its values are the run's
elements in order.

>>> [piece.spec for piece in pieces((4, 6), 8, 21)]
['4 6 1,1:2,4', '4 6 2,1:0,6', '4 6 3,1:0,3']
>>> [piece.spec for piece in pieces((4, 6), 0, 24)]  # the whole tensor
['4 6 0,4:0,6']
"""

import dataclasses
import math
from typing import List, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Piece:
    """One rectangle of a flat run.

    Attributes:
      offsets, lengths: its start and size in each dimension.
      start, stop: the flat run it covers, ``[start, stop)``.
      spec: the checkpoint's slice spec for it (shape, then
        ``offset,length`` per dimension).
    """

    shape: Tuple[int, ...]
    offsets: Tuple[int, ...]
    lengths: Tuple[int, ...]
    start: int
    stop: int

    @property
    def spec(self) -> str:
        extents = ":".join(f"{offset},{length}"
                           for offset, length in zip(self.offsets, self.lengths))
        return " ".join(str(d) for d in self.shape) + " " + extents


def pieces(shape: Sequence[int], start: int, stop: int) -> List[Piece]:
    """The rectangles of ``shape`` that elements ``[start, stop)`` (flat,
    row-major) make, in order; none for an empty run.

    >>> [(p.offsets, p.lengths, p.start, p.stop) for p in pieces((2, 3), 2, 4)]
    [((0, 2), (1, 1), 2, 3), ((1, 0), (1, 1), 3, 4)]
    """
    shape = tuple(int(d) for d in shape)
    if not shape:
        raise ValueError("a scalar has no pieces: it is saved whole")
    return [Piece(shape, offsets, lengths, begin, begin + math.prod(lengths))
            for offsets, lengths, begin in _rectangles(shape, start, stop, 0)]


def _rectangles(shape, start, stop, base):
    """(offsets, lengths, flat start) of the rectangles of run
    ``[start, stop)`` of ``shape``; ``base``: the flat index of element 0."""
    if start >= stop:
        return []
    if len(shape) == 1:
        return [((start,), (stop - start,), base + start)]
    inner = math.prod(shape[1:])
    first_row, first_offset = divmod(start, inner)
    last_row, last_offset = divmod(stop, inner)

    def in_row(row, begin, end):
        return [((row,) + offsets, (1,) + lengths, flat)
                for offsets, lengths, flat in _rectangles(shape[1:], begin, end,
                                                          base + row * inner)]

    if first_row == last_row:
        return in_row(first_row, first_offset, last_offset)
    found = []
    if first_offset:
        found += in_row(first_row, first_offset, inner)
        first_row += 1
    if last_row > first_row:
        found.append(((first_row,) + (0,) * (len(shape) - 1),
                      (last_row - first_row,) + tuple(shape[1:]), base + first_row * inner))
    if last_offset:
        found += in_row(last_row, 0, last_offset)
    return found
