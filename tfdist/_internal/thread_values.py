"""A value one thread sets for a block and reads inside it: what tfdist's
wrappers of Keras and TensorFlow functions ask while a step is traced
("is this read inside a pipelined step?", "which replica's share?").

Each strategy traces a replica's step on its own thread, so the value is
per thread: another replica's trace sees its own. Blocks nest; leaving
one restores the value it replaced, also when the block raises.

>>> inside = ThreadValue(default=False)
>>> with inside.set_to(True):
...     with inside.set_to("nested"):
...         inner = inside.get()
...     outer = inside.get()
>>> inner, outer, inside.get()
('nested', True, False)
>>> depth = ThreadValue(default=0)
>>> with depth.deeper(), depth.deeper():
...     print(depth.get())
2
"""

import contextlib
import threading


class ThreadValue:
    """``get()`` is the value this thread's innermost ``set_to`` block gave,
    or ``default`` outside every block."""

    def __init__(self, default=None):
        self._default = default
        self._local = threading.local()

    def get(self):
        return getattr(self._local, "value", self._default)

    @contextlib.contextmanager
    def set_to(self, value):
        """Within the block, `get` returns ``value`` on this thread."""
        outer = self.get()
        self._local.value = value
        try:
            yield value
        finally:
            self._local.value = outer

    def deeper(self):
        """A block one level deeper: `get` (a count) is one more within it."""
        return self.set_to(self.get() + 1)
