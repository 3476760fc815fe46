"""Loads a program from strategies/ as a module, once per test session: the
programs define absl flags, which may be defined only once per process."""

import importlib.util
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_program(name: str):
    """``strategies/<name>.py`` as a module (cached in ``sys.modules``)."""
    if str(REPO / "strategies") not in sys.path:  # as `python strategies/<name>.py` has it
        sys.path.append(str(REPO / "strategies"))
    key = f"tfdist_program_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "strategies" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
