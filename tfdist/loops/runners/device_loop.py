"""The device-side loop of k steps per host call, shared by the runners and
`tfdist.loops.host_loop.HostLoop`.

Internal: a hand-written loop uses `HostLoop`, the Trainer its runner.
"""

from typing import Callable, Optional

import tensorflow as tf

from tfdist._internal import collectives
from tfdist.errors import ConfigurationError


def device_loop(strategy: tf.distribute.Strategy, replica_step: Callable, *,
                after_step: Optional[Callable] = None, check_end: bool = True):
    """A ``tf.function(iterator, num_steps)`` that runs up to ``num_steps``
    of ``strategy.run(replica_step, (element,))`` and returns the steps run.
    ``after_step`` runs in cross-replica context after each step.

    ``check_end=False``: the caller knows the iterator has ``num_steps``
    more elements (`tfdist.data.distribute_counted`), so each step reads
    with ``next`` instead of ``get_next_as_optional`` plus a test and a
    ``break``, which makes each host call cheaper: about what a
    hand-written loop pays (figures:
    docs/performance.md#measurements-behind-design-choices). Reading past
    the end raises ``OutOfRangeError``.
    """

    @collectives.function  # instance keys fixed at trace: flat memory per call
    def loop(iterator, num_steps):
        steps_run = tf.constant(0, tf.int64)
        for _ in tf.range(num_steps):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            strategy.run(replica_step, args=(optional.get_value(),))
            if after_step is not None:  # cross-replica work of the step
                after_step()
            steps_run += 1
        return steps_run

    @collectives.function
    def loop_without_end_check(iterator, num_steps):
        for _ in tf.range(num_steps):
            strategy.run(replica_step, args=(next(iterator),))
            if after_step is not None:
                after_step()
        return num_steps

    return _raising_configuration_errors(loop if check_end else loop_without_end_check)


def _raising_configuration_errors(traced_loop):
    """``traced_loop`` whose tracing errors about the step's configuration
    surface as themselves: autograph re-raises an error from tracing the
    step as its own StagingError, with tfdist's `ConfigurationError` (e.g.
    a model's own step that a `tfdist.communication` part cannot run) as
    its context."""

    def run(iterator, num_steps):
        try:
            return traced_loop(iterator, num_steps)
        except Exception as error:  # pylint: disable=broad-except
            if (isinstance(error.__context__, ConfigurationError)
                    and not isinstance(error, ConfigurationError)):
                raise error.__context__ from None
            raise

    return run
