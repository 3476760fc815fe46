"""One benchmark configuration on a real cluster, run under tfdist-run.

    tfdist-run --num_workers=2 -- python scripts/bench/cluster_program.py --config=JSON --output=F
    tfdist-run --num_workers=2 --num_ps=1 -- python scripts/bench/cluster_program.py ...

MultiWorkerMirroredStrategy: every worker runs this program; the contenders
alternate in the same order on every worker (their collectives pair up),
and the workers agree on the window length by an all-reduce. Parameter
servers: this program is the chief (coordinator) and the contenders
schedule steps on the worker servers. The chief writes the result JSON.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402
from bench import contenders, measure, teardown  # noqa: E402

flags.DEFINE_string("config", None, "JSON: strategy, model, contenders, window, rounds.")
flags.DEFINE_string("output", None, "Where the chief writes its JSON.")
FLAGS = flags.FLAGS


def _agreement(strategy, steps_per_execution: int):
    """``agree(steps)``: the workers' mean window, a whole number of executions."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    @tf.function
    def mean(value):
        per_replica = strategy.run(lambda v: tf.identity(v), args=(value,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    def agree(steps: int) -> int:
        executions = round(float(mean(tf.constant(float(steps)))) / steps_per_execution)
        return max(2, int(executions)) * steps_per_execution

    return agree


def main(argv) -> None:
    del argv  # every option is a flag
    args = FLAGS
    config = json.loads(args.config)

    import tfdist  # pylint: disable=import-outside-toplevel

    if not config.get("keep_teardown_stall"):
        teardown.remove_iterator_teardown_stall()
    kind = config["strategy"].partition(":")[0]
    spe = config["steps_per_execution"]
    if kind == "parameter_server":
        strategy = tfdist.make_strategy("parameter_server", timeout_seconds=120)
        agree = lambda steps: steps  # noqa: E731  (the chief alone decides)
    else:
        strategy = tfdist.make_strategy("multi_worker_mirrored")
        agree = _agreement(strategy, spe)
    builders = contenders.builders(strategy, config["model"], config["global_batch_size"],
                                   spe, config["contenders"])
    result = measure.measure(
        builders, batch_size=config["global_batch_size"], steps_per_execution=spe,
        window_seconds=config["window_seconds"], rounds=config["rounds"],
        probe_steps=config["probe_steps"], agree=agree,
        progress=lambda line: print(line, flush=True))
    if tfdist.cluster.is_chief():
        pathlib.Path(args.output).write_text(json.dumps(dict(result, config=config)))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "output"])
    app.run(main)
