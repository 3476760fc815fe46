"""Where the TensorFlow runtime started, for errors that come too late.

Logical devices (``make_strategy("mirrored", num_replicas=4)`` on a CPU)
can only be configured before TensorFlow's runtime starts, and it starts
silently at the first op, dataset or device listing: in the official
tutorials, loading the data before making the strategy. When that is too
late, the error should name the line that started it.

`watch` records the Python stack at the runtime's start: it wraps
``Context.ensure_initialized`` until its first call (then puts TensorFlow's
own back), so it observes and changes nothing. ``import tfdist`` calls it:
at once when TensorFlow is already imported, else when TensorFlow's eager
context module is imported (a `sys.meta_path` finder that removes itself).
A runtime that started before ``import tfdist`` has no record, and
`started_at` says so.
"""

import importlib.abc
import importlib.util
import os
import sys
import traceback
from typing import Optional

_CONTEXT_MODULE = "tensorflow.python.eager.context"
_record = {}


def watch() -> None:
    """Records the stack of the runtime's start from now on (idempotent)."""
    if _record.get("watching"):
        return
    _record["watching"] = True
    module = sys.modules.get(_CONTEXT_MODULE)
    if module is not None:
        _wrap(module)
    else:
        sys.meta_path.insert(0, _WhenImported())


def started_at() -> Optional[str]:
    """``File "x.py", line 12: <code>``: the user's line that started the
    runtime (the innermost frame outside TensorFlow, Keras and tfdist), or
    None when it started unseen."""
    stack = _record.get("stack")
    if not stack:
        return None
    frames = [f for f in stack if not _is_library(f.filename)] or list(stack)
    frame = frames[-1]
    code = f": {frame.line.strip()}" if frame.line else ""
    return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}{code}'


def _is_library(filename: str) -> bool:
    tfdist_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (filename.startswith(tfdist_dir) or "site-packages" in filename
            or "dist-packages" in filename or filename.startswith("<frozen"))


def _wrap(context_module) -> None:
    context_class = context_module.Context
    original = context_class.ensure_initialized
    if context_module.context_safe() is not None and context_module.context()._initialized:  # pylint: disable=protected-access
        return  # started before tfdist could watch

    def ensure_initialized(self):
        if not self._initialized and "stack" not in _record:  # pylint: disable=protected-access
            _record["stack"] = traceback.extract_stack()[:-1]
            context_class.ensure_initialized = original
        return original(self)

    context_class.ensure_initialized = ensure_initialized


class _WhenImported(importlib.abc.MetaPathFinder):
    """Wraps the context module's class right after it is first imported."""

    def find_spec(self, name, path, target=None):  # pylint: disable=unused-argument
        if name != _CONTEXT_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap
        return spec
