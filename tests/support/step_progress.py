"""What a test program prints at each step, for fault tests to read: the
updates a (restored) run started from, and each step's end, with an
optional pause after it so a test can strike mid-epoch; and an in-process
stop before a given step (`interrupt_at`)."""

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


def interrupt_at(epoch: int, batch: int):
    """A Keras callback raising KeyboardInterrupt before training batch
    ``batch`` of epoch ``epoch`` (a run stopped mid-epoch, in process)."""
    import keras  # pylint: disable=import-outside-toplevel

    seen = {}

    def before_epoch(index, logs):
        del logs
        seen["epoch"] = index

    def before_step(index, logs):
        del logs
        if (seen.get("epoch"), index) == (epoch, batch):
            raise KeyboardInterrupt(f"interrupted at epoch {epoch}, batch {batch}")

    return keras.callbacks.LambdaCallback(on_epoch_begin=before_epoch,
                                          on_train_batch_begin=before_step)
