"""The runner contract as cases every runner goes through
(`tfdist.loops.runners.base.Runner`; `tests/loops/test_runner_contract.py`).

`observe(make_runner, strategy)` runs each case on fresh runners and
returns what it saw as plain data; `EXPECTED` is what the contract says,
worked out by hand from the data (global batch ``i`` holds the examples
``4i .. 4i + 3``, so its ``x`` sums to ``16i + 6``). The synchronous
runner runs the cases in the test process (through the device loop both
with and without its end check); the coordinator runs them in a process
of its own (`tests/programs/runner_contract_on_parameter_servers.py`),
because connecting to a cluster cannot be undone in a process.

Cases the contract leaves to a runner (data that ends under parameter
servers, whose workers read endless streams) are listed in
`NOT_APPLICABLE` with the reason.
"""

from typing import Callable, Dict, List

import tensorflow as tf

from tfdist.data import epochs
from tfdist.loops.cadence import ExecutionPlan
from tfdist.loops.runners.base import Runner

BATCHES = 10
BATCH_SIZE = 4


def batch_sum(index: int) -> float:
    """The sum of global batch ``index``'s features (examples 4i .. 4i + 3)."""
    return float(sum(range(BATCH_SIZE * index, BATCH_SIZE * (index + 1))))


def sums(first: int, count: int) -> float:
    """The features of ``count`` batches from ``first``, the data repeating."""
    return sum(batch_sum((first + i) % BATCHES) for i in range(count))


EXPECTED = {
    # Two executions of 3 steps back to back: both run, advance after each.
    "plan": {"execution": [6, False, False], "advanced": [3, 3], "trained": sums(0, 6)},
    # The same plan where tf.data cannot know the length (a filter): the
    # device loop with its end check.
    "plan_unknown_length": {"execution": [6, False, False], "advanced": [3, 3],
                            "trained": sums(0, 6)},
    # A stop asked before the first execution ends it after that execution.
    "stop": {"execution": [3, True, False], "advanced": [3], "trained": sums(0, 3)},
    # Resuming after 4 steps: the next 2 steps read batches 4 and 5.
    "resume": {"execution": [2, False, False], "advanced": [2], "trained": sums(4, 2)},
    # 3 executions of 4 steps over 10 batches: the data ends in the third.
    "end_of_data": {"execution": [10, False, True], "advanced": [4, 4, 2],
                    "trained": sums(0, 10)},
    # Evaluation reads every batch once, or the first `steps`.
    "evaluate": {"all": sums(0, BATCHES), "first_3": sums(0, 3)},
    # Alone, a worker's flag is everyone's.
    "any_worker": [True, False],
    "is_a_runner": True,
}

NOT_APPLICABLE = {
    "coordinator": {
        "end_of_data": "parameter-server workers read endless streams (fit needs "
                       "steps_per_epoch: CoordinatorRunner.check_fit)",
    },
}


def global_batches(unknown_length: bool = False) -> tf.data.Dataset:
    """10 global batches of 4 examples, ``x`` the example's index."""
    x = tf.reshape(tf.range(BATCHES * BATCH_SIZE, dtype=tf.float32), [-1, 1])
    data = tf.data.Dataset.from_tensor_slices((x, tf.zeros([BATCHES * BATCH_SIZE])))
    if unknown_length:
        data = data.filter(lambda x, y: True)
    return data.batch(BATCH_SIZE)


class _Counters:
    """Sums of the features each kind of step saw, on the strategy's variables."""

    def __init__(self, strategy):
        with strategy.scope():
            self.trained = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)
            self.evaluated = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)

    def train_step(self, structure):
        self.trained.assign_add(_real_sum(structure))

    def eval_step(self, structure):
        self.evaluated.assign_add(_real_sum(structure))


def _real_sum(structure) -> tf.Tensor:
    """The replica's features, padding rows (mask 0) left out."""
    x = tf.reshape(structure["x"], [-1])
    if "mask" in structure:
        x = x * tf.reshape(structure["mask"], [-1])
    return tf.reduce_sum(x)


def _train(make_runner, strategy, plan: ExecutionPlan, *, unknown_length=False,
           skip_steps=0, stop_at_once=False) -> Dict:
    counters = _Counters(strategy)
    runner = make_runner(strategy, counters.train_step, counters.eval_step)
    source = epochs.as_source(global_batches(unknown_length))
    iterator = runner.iterator(source, epoch=0, skip_steps=skip_steps, partial_batch="exact")
    advanced: List[int] = []
    execution = runner.train(iterator, plan, lambda: stop_at_once, advanced.append)
    runner.sync()
    return {"execution": [execution.steps, execution.stop, execution.end_of_data],
            "advanced": advanced, "trained": float(counters.trained.numpy())}


def _evaluate(make_runner, strategy) -> Dict:
    results = {}
    for name, steps in (("all", None), ("first_3", 3)):
        counters = _Counters(strategy)
        runner = make_runner(strategy, counters.train_step, counters.eval_step)
        runner.evaluate(epochs.as_source(global_batches()), steps=steps, partial_batch="exact")
        runner.sync()
        results[name] = float(counters.evaluated.numpy())
    return results


def _any_worker(make_runner, strategy) -> List[bool]:
    counters = _Counters(strategy)
    runner = make_runner(strategy, counters.train_step, counters.eval_step)
    return [runner.any_worker(True), runner.any_worker(False)]


def _is_a_runner(make_runner, strategy) -> bool:
    counters = _Counters(strategy)
    return isinstance(make_runner(strategy, counters.train_step, counters.eval_step), Runner)


CASES: Dict[str, Callable] = {
    "plan": lambda make, strategy: _train(make, strategy, ExecutionPlan(3, executions=2)),
    "plan_unknown_length": lambda make, strategy: _train(
        make, strategy, ExecutionPlan(3, executions=2), unknown_length=True),
    "stop": lambda make, strategy: _train(
        make, strategy, ExecutionPlan(3, executions=2), stop_at_once=True),
    "resume": lambda make, strategy: _train(make, strategy, ExecutionPlan(2), skip_steps=4),
    "end_of_data": lambda make, strategy: _train(
        make, strategy, ExecutionPlan(4, executions=3, ends_epoch=True)),
    "evaluate": _evaluate,
    "any_worker": _any_worker,
    "is_a_runner": _is_a_runner,
}


def observe(make_runner, strategy, runner_name: str) -> Dict:
    """What each applicable case did with ``make_runner(strategy, train_step,
    eval_step)``."""
    skipped = NOT_APPLICABLE.get(runner_name, {})
    return {name: case(make_runner, strategy) for name, case in CASES.items()
            if name not in skipped}
