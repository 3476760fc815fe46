"""What a test program prints at each step, for fault tests to read: the
updates a (restored) run started from, and each step's end, with an
optional pause after it so a test can strike mid-epoch."""

import time


def callback(model, step_delay: float = 0.0):
    """A Keras callback printing ``first step after N updates`` before the
    run's first step and ``epoch step K done`` after each, then sleeping
    ``step_delay`` seconds."""
    import keras  # pylint: disable=import-outside-toplevel

    started = []

    def before_step(batch, logs):  # (the updates a restored checkpoint brought)
        del batch, logs
        if not started:
            started.append(int(model.optimizer.iterations.numpy()))
            print(f"first step after {started[0]} updates", flush=True)

    def after_step(batch, logs):
        del logs
        print(f"epoch step {batch + 1} done", flush=True)
        time.sleep(step_delay)

    return keras.callbacks.LambdaCallback(on_train_batch_begin=before_step,
                                          on_train_batch_end=after_step)
