"""What Keras 3 ``fit`` gets wrong under tf.distribute, measured next to tfdist.

Each case trains the test MLP (tests/support/reference.py) three ways on the same
data in the same order: one device with plain Keras (the reference), Keras
``model.fit`` under the strategy, and the same unchanged ``model.fit`` after
``tfdist.attach``. It prints the largest weight difference from the
reference (or the error Keras raised), as a Markdown table row:

    python scripts/keras_vs_tfdist.py                 # the in-process cases
    python scripts/keras_vs_tfdist.py --multi_worker  # + 2 workers under tfdist-run
    python scripts/keras_vs_tfdist.py --parameter_server  # + 1 worker, 1 ps

The multi-worker and parameter-server rows start real local clusters.
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tfdist  # noqa: E402
from absl import app, flags  # noqa: E402

flags.DEFINE_bool("multi_worker", False, "Also 2 workers under tfdist-run.")
flags.DEFINE_bool("parameter_server", False, "Also 1 worker and 1 ps under tfdist-run.")
flags.DEFINE_enum("worker_of", None, ["mwms", "ps"],
                  "(internal) run as one task of that cluster row.")
flags.DEFINE_string("output", None, "(internal) where the chief of a cluster row writes.")
FLAGS = flags.FLAGS

EPOCHS = 3
CLUSTER_TIMEOUT = 300


def _max_difference(expected, weights) -> float:
    import numpy as np  # pylint: disable=import-outside-toplevel

    return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(expected, weights))


def _reference(ref, x, y, batch_size, optimizer_options):
    model = ref.compile_model(ref.build_mlp(), "adam")
    for name, value in optimizer_options.items():
        setattr(model.optimizer, name, value)
    model.fit(x, y, batch_size=batch_size, epochs=EPOCHS, shuffle=False, verbose=0)
    return model.get_weights()


def _fit_under(strategy, ref, x, y, batch_size, attach, optimizer_options,
               steps_per_execution=1, **fit_options):
    """Weights after ``model.fit`` under ``strategy``, or the error's first line."""
    try:
        with strategy.scope():
            model = ref.build_mlp()
            optimizer = ref.make_optimizer("adam")
            for name, value in optimizer_options.items():
                setattr(optimizer, name, value)
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                          steps_per_execution=steps_per_execution)
        if attach:
            tfdist.attach(model, strategy)
        model.fit(x, y, batch_size=batch_size, epochs=EPOCHS, shuffle=False, verbose=0,
                  **fit_options)
        return model.get_weights()
    except Exception as error:  # pylint: disable=broad-except
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:90]}"


def _row(name, expected, keras_result, tfdist_result) -> str:
    def cell(result):
        return result if isinstance(result, str) else f"{_max_difference(expected, result):.1e}"

    return f"| {name} | {cell(keras_result)} | {cell(tfdist_result)} |"


IN_PROCESS_CASES = [
    # name, replicas, rows, micro batch, reference batch, optimizer options, spe
    ("MirroredStrategy(4), last batch 6 of 16", 4, 70, 16, 16, {}, 1),
    ("MirroredStrategy(4), last batch 2 (empty replicas)", 4, 66, 16, 16, {}, 1),
    ("MirroredStrategy(2), steps_per_execution=2", 2, 70, 16, 16, {}, 2),
    ("MirroredStrategy(4), global_clipnorm=0.05", 4, 70, 16, 16, {"global_clipnorm": 0.05}, 1),
    ("one device, gradient_accumulation_steps=3 (37 rows, batch 8 vs 24)",
     1, 37, 8, 24, {"gradient_accumulation_steps": 3}, 1),
    ("MirroredStrategy(4), gradient_accumulation_steps=3 (37 rows, batch 8 vs 24)",
     4, 37, 8, 24, {"gradient_accumulation_steps": 3}, 1),
]


def in_process_rows():
    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    rows = []
    for name, replicas, num_rows, batch, reference_batch, options, spe in IN_PROCESS_CASES:
        x, y, _ = ref.classification_arrays(num_rows)
        reference_options = {k: v for k, v in options.items()
                             if k != "gradient_accumulation_steps"}
        expected = _reference(ref, x, y, reference_batch, reference_options)
        results = []
        for attach in (False, True):
            strategy = (tfdist.make_strategy("one_device") if replicas == 1 else
                        tfdist.make_strategy("mirrored", num_replicas=replicas))
            results.append(_fit_under(strategy, ref, x, y, batch, attach, options, spe))
        rows.append(_row(name, expected, *results))
        print(rows[-1], flush=True)
    return rows


def cluster_worker(args):
    """One task of a cluster row: Keras fit, then tfdist fit; the chief writes."""
    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    name = "parameter_server" if args.worker_of == "ps" else "multi_worker_mirrored"
    strategy = tfdist.make_strategy(name)
    x, y, _ = ref.classification_arrays(70)
    # (Parameter servers need steps_per_epoch: 5 batches of 16 cover the 70 rows.)
    options = {"steps_per_epoch": 5} if name == "parameter_server" else {}
    keras_result = _fit_under(strategy, ref, x, y, 16, False, {}, **options)
    tfdist_result = _fit_under(strategy, ref, x, y, 16, True, {}, **options)
    if tfdist.cluster.is_chief():
        def plain(result):
            return result if isinstance(result, str) else [w.tolist() for w in result]

        with open(args.output, "w", encoding="utf-8") as out:
            json.dump({"keras": plain(keras_result), "tfdist": plain(tfdist_result)}, out)


def cluster_row(kind: str) -> str:
    from tests.support import reference as ref  # pylint: disable=import-outside-toplevel

    output = os.path.join(tempfile.mkdtemp(prefix="tfdist-keras-vs-"), "result.json")
    launcher = ["--num_workers=2"] if kind == "mwms" else ["--num_workers=1", "--num_ps=1"]
    command = [sys.executable, "-m", "tfdist.launch", *launcher, "--", sys.executable,
               os.path.abspath(__file__), f"--worker_of={kind}", f"--output={output}"]
    launcher = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        launcher.wait(timeout=CLUSTER_TIMEOUT)
    except subprocess.TimeoutExpired:
        launcher.terminate()  # tfdist-run stops its tasks within its grace period
        launcher.wait(timeout=60)
    if os.path.exists(output):
        with open(output, encoding="utf-8") as result:
            results = json.load(result)
    else:
        results = {"keras": f"no result within {CLUSTER_TIMEOUT} s", "tfdist": "-"}
    x, y, _ = ref.classification_arrays(70)
    expected = _reference(ref, x, y, 16, {})
    name = ("MultiWorkerMirroredStrategy, 2 workers" if kind == "mwms"
            else "ParameterServerStrategy, 1 worker + 1 ps")
    row = _row(name, expected, results["keras"], results["tfdist"])
    print(row, flush=True)
    return row


def main(argv) -> None:
    del argv  # every option is a flag
    args = FLAGS
    if args.worker_of:
        cluster_worker(args)
        return
    tfdist.strategies.configure_logical_cpus(4)  # before TensorFlow starts
    print("| case | Keras 3 `fit`: max weight diff from one device | tfdist.attach |")
    print("|---|---|---|")
    if args.multi_worker:
        cluster_row("mwms")
    if args.parameter_server:
        cluster_row("ps")
    in_process_rows()


if __name__ == "__main__":
    app.run(main)
