"""Internals of another library that tfdist reads by name, found or
reported: what `tfdist._internal.keras.privates` and
`tfdist._internal.tensorflow.privates` share. Standard library only, so
the contract tests can read the lists where ``import tfdist`` fails.

>>> found("os.path", "join").__name__
'join'
>>> class Entry:
...     def find(self):
...         return found("os", "no_such_name")
>>> [why for _, why in missing([Entry()])]
["AttributeError: module 'os' has no attribute 'no_such_name'"]
"""

import importlib
from typing import List, Sequence, Tuple


def found(module: str, attribute: str):
    """``attribute`` (a dotted path; empty: the module) of ``module``, or
    raises ImportError / AttributeError."""
    result = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        result = getattr(result, part)
    return result


def missing(entries: Sequence) -> List[Tuple[object, str]]:
    """``[(entry, why), ...]`` for each of ``entries`` (each with a
    ``find()``) that is not where tfdist reads it."""
    gone = []
    for entry in entries:
        try:
            entry.find()
        except (ImportError, AttributeError) as error:
            gone.append((entry, f"{type(error).__name__}: {error}"))
    return gone
