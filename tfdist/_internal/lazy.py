"""Package attributes that load on first use.

Each tfdist package names its public objects in a table and leaves its
submodules importable by attribute, without importing either up front: so
``import tfdist`` (and the ``tfdist-run`` launcher, which needs no
TensorFlow) stays fast, and a package never imports its own submodules at
import time (no cycle through a package's ``__init__``).

>>> from tfdist._internal import lazy
>>> __getattr__ = lazy.attributes("tfdist.cluster", {"is_chief": "tfdist.cluster.tf_config"})
>>> __getattr__("is_chief").__name__
'is_chief'
>>> __getattr__("platforms").__name__
'tfdist.cluster.platforms'
"""

import importlib.util
from typing import Callable, Mapping

from tfdist._internal import tf_logs


def attributes(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` for ``package`` (PEP 562): ``names``
    maps each public name to the module that defines it; any other name is
    looked up as a submodule of ``package``."""

    def __getattr__(name: str):
        if name in names:
            return getattr(tf_logs.import_module(names[name]), name)
        if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return tf_logs.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
