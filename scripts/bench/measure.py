"""One configuration measured: build each contender, calibrate, alternate."""

import json
import os
import resource
import subprocess
import sys
import time
from typing import Callable, Dict

from bench import contenders, timing


def rss_mb() -> float:
    """This process's resident memory now, in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tensor_mb(tf, key: str):
    """TensorFlow's count of live tensor bytes on the CPU (``current``), or
    its peak since the last call (``peak``), in MiB; None unless the BFC
    allocator runs (``TF_CPU_ALLOCATOR_USE_BFC``)."""
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        return None
    value = tf.config.experimental.get_memory_info("CPU:0")[key] / 2**20
    tf.config.experimental.reset_memory_stats("CPU:0")
    return value


def held_mb(strategy, variables) -> float:
    """What this worker's replicas keep of ``variables``, in MiB (a sharded
    variable's local slices)."""
    return sum(part.numpy().nbytes for v in variables
               for part in strategy.experimental_local_results(v.value)) / 2**20


def kept_by_device(variables) -> dict:
    """Bytes of ``variables`` (Keras variables; every replica's copy or
    slice, or every piece a ParameterServerStrategy's ps tasks hold) that
    each device keeps, by device name."""
    from tfdist.strategies import sharded  # pylint: disable=import-outside-toplevel

    kept = {}
    for variable in variables:
        value = variable.value
        copies = sharded.shards(variable) if sharded.is_sharded(variable) else \
            getattr(value, "values", [value])
        for copy in copies:
            size = int(copy.shape.num_elements()) * copy.dtype.size
            kept[copy.device] = kept.get(copy.device, 0) + size
    return kept


def _first_line(error: Exception) -> str:
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f"{type(error).__name__}: {line[:200]}"


def measure(builders: Dict[str, Callable], *, batch_size: int, steps_per_execution: int,
            window_seconds: float, rounds: int, probe_steps: int = 64,
            agree: Callable[[int], int] = lambda steps: steps,
            progress: Callable[[str], None] = print) -> dict:
    """Builds and warms up every contender (a failure is recorded, not
    raised), sizes the window from the reference's speed so it lasts about
    ``window_seconds``, runs every contender for one untimed window, then
    times ``rounds`` rounds of `timing.schedule`.

    The untimed round: every contender's first full window ran slower than
    its later ones, the loop's too (one device, MLP, spe 16: the loop at
    423k examples/s in its first window, 479-520k in the next three; spe 1:
    tfdist at 247k, then 265-277k), and a full window is the first to reach
    what the short warm-up does not (a log point every 100 steps, whose
    first read is traced under MirroredStrategy).

    ``agree(steps)`` makes every worker of a cluster use the same window.
    """
    spe = steps_per_execution
    probe = max(2 * spe, probe_steps // spe * spe)
    results, runners = {}, {}
    for name, build in builders.items():
        before, start = rss_mb(), time.perf_counter()
        try:
            run = build()
            run(probe)  # tracing and compilation, then `probe` steps
        except Exception as error:  # pylint: disable=broad-except
            results[name] = {"error": _first_line(error)}
            progress(f"{name}: {results[name]['error']}")
            continue
        results[name] = {"first_run_s": time.perf_counter() - start,
                         "rss_growth_mb": rss_mb() - before}
        runners[name] = run
        progress(f"{name}: built and warmed up in {results[name]['first_run_s']:.1f} s")
    if not runners:
        return {"window_steps": 0, "results": results}
    reference = contenders.REFERENCE if contenders.REFERENCE in runners else next(iter(runners))
    start = time.perf_counter()
    runners[reference](probe)
    steps = agree(timing.window_steps((time.perf_counter() - start) / probe,
                                      window_seconds, spe))
    progress(f"window: {steps} steps (about {window_seconds:g} s of {reference})")
    for run in runners.values():  # one untimed window each, in the same order on every worker
        run(steps)
    timeline = timing.alternate(runners, rounds, steps, batch_size,
                                reference=contenders.REFERENCE, progress=progress)
    for name, values in timing.rates_by_name(timeline).items():
        results[name].update(rates=values, examples_per_s=timing.summary(values))
    for name, ratio in timing.paired_ratios(timeline, contenders.REFERENCE).items():
        results[name]["vs_loop"] = ratio
    for name, ratio in timing.ratios_between(timeline, contenders.REFERENCE,
                                             "keras_fit").items():
        results[name]["vs_keras"] = ratio
    return {"window_steps": steps, "results": results, "peak_rss_mb": peak_rss_mb()}


def run_own_form(script: str, form: str, flag_names) -> dict:
    """Runs ``script`` (a measuring script) in its one-run form ``form``
    (e.g. ``"--form_of=..."``) in a fresh process (`row_in_fresh_process`),
    passing on the values of the absl flags ``flag_names`` this run was
    given; prints and returns its row."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    row = row_in_fresh_process([sys.executable, script, form] + [
        f"--{name}={flags.FLAGS[name].value}" for name in flag_names])
    print(row, flush=True)
    return row


def row_in_fresh_process(command, timeout: float = 1800) -> dict:
    """Runs ``command`` (a measuring script's own one-run form) in a fresh
    process, so no run inherits another's memory or TensorFlow state, and
    returns the JSON row it prints last; a failed run raises."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
