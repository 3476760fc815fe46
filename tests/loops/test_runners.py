"""The synchronous runner reads the data without an end check only while
it certainly lasts (`tfdist.data.distribute_counted`, `CountedLoops`)."""

import math

import pytest
import tensorflow as tf

import tfdist
from tfdist.loops.runners.synchronous import CountedIterator, CountedLoops


def _batches(examples: int, batch_size: int = 4) -> tf.data.Dataset:
    features = tf.reshape(tf.range(examples * 2, dtype=tf.float32), [examples, 2])
    return tf.data.Dataset.from_tensor_slices((features, tf.zeros([examples]))).batch(batch_size)


def _steps_in(distributed) -> int:
    return sum(1 for _ in distributed)


@pytest.mark.parametrize("num_replicas", [1, 2, 4])
def test_guaranteed_steps_are_endless_known_or_zero(make_strategy, num_replicas):
    strategy = make_strategy(num_replicas)

    def counted(data, **options):
        return tfdist.data.distribute_counted(strategy, data, avoid_empty_replicas=True, **options)

    _, endless = counted(_batches(9).repeat())
    assert endless == math.inf
    # 9 examples in batches of 4: 3 global batches, the last of 1 (padded
    # for 2 and 4 replicas).
    distributed, known = counted(_batches(9))
    assert known == 3 == _steps_in(distributed)
    distributed, resumed = counted(_batches(9), skip_steps=1)
    assert resumed == 2 == _steps_in(distributed)
    # tf.data cannot know a filtered length: nothing is guaranteed.
    _, filtered = counted(_batches(9).filter(lambda x, y: True))
    assert filtered == 0
    _, per_replica = counted(lambda context: _batches(9))
    assert per_replica == 0


def test_executions_within_the_guarantee_run_without_end_check(make_strategy):
    strategy = make_strategy(2)
    loops = CountedLoops(strategy, lambda structure: None)
    distributed = tfdist.data.distribute(strategy, _batches(20), avoid_empty_replicas=True)

    counted = CountedIterator(iter(distributed), 5)  # the data's true length
    assert loops.run(counted, 4) == 4 and counted.guaranteed_steps == 1
    assert loops.run(counted, 4) == 1  # past the guarantee: checked, ends short
    assert loops.run(counted, 4) == 0 and counted.guaranteed_steps == 0

    # A guarantee beyond the data reads past its end: proof that no end
    # check ran (a checked loop would have returned 5).
    over_counted = CountedIterator(iter(distributed), 6)
    with pytest.raises(tf.errors.OutOfRangeError):
        loops.run(over_counted, 6)
