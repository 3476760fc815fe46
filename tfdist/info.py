"""``python -m tfdist``: what to paste into a bug report.

Prints tfdist's, TensorFlow's, Keras' and Python's versions, the devices
TensorFlow finds (and, where it finds no GPU or TPU, why not as far as
TensorFlow can tell), and this process's cluster role as ``TF_CONFIG`` gives
it (a malformed ``TF_CONFIG`` is reported, not raised).

>>> text = report(environ={"TF_CONFIG": "not json"})
>>> "TF_CONFIG" in text and "invalid" in text
True
"""

import os
import platform
import sys
from typing import List, Mapping, Optional

import tfdist
from tfdist import versions
from tfdist._internal import tf_logs
from tfdist.cluster import tf_config
from tfdist.errors import ConfigurationError


def _versions() -> List[str]:
    tf = tf_logs.import_module("tensorflow")
    import keras  # pylint: disable=import-outside-toplevel

    return [f"tfdist {tfdist.__version__}",
            f"tensorflow {tf.__version__} ({versions.support('tensorflow', tf.__version__)})",
            f"keras {keras.__version__} ({versions.support('keras', keras.__version__)}; "
            f"{versions.pair(tf.__version__, keras.__version__)})",
            f"python {platform.python_version()} ({sys.platform}, {platform.machine()})"]


def _devices(environ: Mapping[str, str]) -> List[str]:
    tf = tf_logs.import_module("tensorflow")
    lines = []
    for kind in ("CPU", "GPU", "TPU"):
        found = tf.config.list_physical_devices(kind)
        lines.append(f"{kind}: {len(found)}" + (
            f" ({', '.join(d.name for d in found)})" if found else f" ({_why_none(kind, tf, environ)})"))
    return lines


def _why_none(kind: str, tf, environ: Mapping[str, str]) -> str:
    if kind == "GPU":
        if not tf.test.is_built_with_cuda():
            return "this TensorFlow build has no CUDA support"
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip() in ("", "-1"):
            return f"CUDA_VISIBLE_DEVICES={visible!r} hides them"
        return ("CUDA found no GPU or failed to start; run with TFDIST_TF_LOGS=1 to see "
                "TensorFlow's reason")
    if kind == "TPU":
        name = environ.get("TPU_NAME")
        return (f"none attached here; TPU_NAME={name!r} names a remote one" if name
                else "none attached and no TPU_NAME set")
    return "none"


def _role(environ: Mapping[str, str]) -> List[str]:
    text = environ.get("TF_CONFIG")
    if not text:
        return ["TF_CONFIG: not set (a single-host job)"]
    try:
        config = tf_config.parse_tf_config(text)
    except ConfigurationError as error:
        return [f"TF_CONFIG: invalid: {error}"]
    jobs = ", ".join(f"{job} x{len(addresses)}" for job, addresses in config.cluster.items())
    return [f"TF_CONFIG: task {tf_config.task_name(config)} "
            f"({'chief' if config.is_chief else 'not chief'}); cluster: {jobs}"]


def report(environ: Optional[Mapping[str, str]] = None) -> str:
    """The report as text; ``environ`` defaults to ``os.environ``."""
    environ = os.environ if environ is None else environ
    return "\n".join(_versions() + _devices(environ) + _role(environ))


def main() -> None:
    text = report()
    try:
        print(text, flush=True)
    except BrokenPipeError:  # (``python -m tfdist | head -3``: the reader has what it wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
