"""``fit`` on a ``PyDataset(workers=2, use_multiprocessing=True)``: plain
Keras on one device, then tfdist on 3 replicas, in a fresh process (forking
worker processes from a process whose TensorFlow has run other tests'
collectives can deadlock, in Keras alone too). Prints the largest weight
difference; exits 1 when over 1e-5. The process must also exit: its forked
pool workers are ended by SIGTERM at exit, which they once swallowed
(tfdist's stop-signal handler, inherited)."""

import faulthandler
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # (conformance)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # (tests.support)

import tfdist  # noqa: E402

tfdist.strategies.configure_logical_cpus(3)

import numpy as np  # noqa: E402

from conformance import test_fit_options as options  # noqa: E402


def main():
    # A hang prints every thread's stack and exits, well before the test's
    # own 300 s bound.
    faulthandler.dump_traceback_later(240, exit=True)
    case = options.CASE
    expected = case.build()
    case.compile(expected)
    initial = expected.get_weights()
    batches = lambda: options.TokenBatches(workers=2, use_multiprocessing=True)  # noqa: E731
    expected_history = expected.fit(batches(), epochs=2, shuffle=False, verbose=0).history
    print("plain Keras fit done", flush=True)
    strategy = tfdist.make_strategy("mirrored", num_replicas=3)
    with strategy.scope():
        model = case.build()
        case.compile(model)
    model.set_weights(initial)
    history = tfdist.attach(model, strategy).fit(batches(), epochs=2, shuffle=False,
                                                 verbose=0).history
    difference = max(float(np.abs(a - b).max())
                     for a, b in zip(expected.get_weights(), model.get_weights()))
    np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-5)
    print(f"largest weight difference {difference:.1e}")
    sys.exit(0 if difference <= 1e-5 else 1)


if __name__ == "__main__":
    main()
