"""A function run once per process: installing a wrapper of a Keras or
TensorFlow function (`tfdist._internal.keras.patches`), which a second
install would wrap twice.

>>> calls = []
>>> install = once(lambda: calls.append("installed"))
>>> install(), install(), calls
(None, None, ['installed'])
"""

import functools
import threading
from typing import Callable


def once(function: Callable[[], None]) -> Callable[[], None]:
    """``function`` made to run on its first call only (threads that call
    it at the same time wait for that first call to finish)."""
    lock = threading.Lock()
    done = []

    @functools.wraps(function)
    def run_once() -> None:
        if done:
            return
        with lock:
            if not done:
                function()
                done.append(True)

    return run_once
