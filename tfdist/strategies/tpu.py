"""``make_strategy("tpu")``: find the TPU, connect, initialize, return a TPUStrategy.

Where TensorFlow looks (`TPUClusterResolver`):

* ``tpu="local"``: the TPU chips of this Cloud TPU VM (needs TensorFlow's
  TPU build with libtpu); refused at once when the machine has no TPU
  device files;
* ``tpu="NAME"`` with ``zone`` and ``project``: a TPU node, found through the
  Cloud TPU API (needs ``pip install cloud-tpu-client``); without zone and
  project, TensorFlow asks the GCE metadata server for them;
* ``tpu="grpc://HOST:PORT"``: a TPU worker at that address;
* ``tpu=None``: the environment (``TPU_NAME``, ``KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS``
  on GKE, ``TPU_CONFIG``).

On a machine without a TPU each of these fails in TensorFlow with a
different raw error (``ValueError``, ``NotFoundError``, ``RuntimeError``) or,
when the metadata server or a gRPC address does not answer, waits without
a bound. Here the search runs with a time limit (``timeout_seconds``) and
every failure becomes one `TPUNotFoundError` that says what was tried and
what to do.
"""

import glob
import os
import threading
from typing import Optional

import tensorflow as tf

from tfdist.errors import ConfigurationError, TPUNotFoundError

ENVIRONMENT_VARIABLES = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")
# Where a Cloud TPU VM's chips appear: /dev/accel* (v2-v4), /dev/vfio/N (v5e on).
LOCAL_TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")


def local_tpu_devices() -> list:
    """The TPU device files of this machine (empty without TPU chips)."""
    return sorted(path for pattern in LOCAL_TPU_DEVICE_PATTERNS for path in glob.glob(pattern))


def _check_arguments(tpu, zone, project, timeout_seconds) -> None:
    for name, value in (("tpu", tpu), ("zone", zone), ("project", project)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigurationError(
                f"`{name}` ({value!r}) must be a non-empty string or None."
            )
    if (not isinstance(timeout_seconds, (int, float)) or isinstance(timeout_seconds, bool)
            or timeout_seconds <= 0):
        raise ConfigurationError(
            f"`timeout_seconds` ({timeout_seconds!r}) must be a positive number "
            "of seconds to wait for the TPU."
        )


def describe_attempt(tpu, zone, project) -> str:
    """What the search tried: the arguments and the environment it read."""
    environment = ", ".join(
        f"{name}={os.environ[name]!r}" if name in os.environ else f"{name} unset"
        for name in ENVIRONMENT_VARIABLES
    )
    return (f"Tried TPUClusterResolver(tpu={tpu!r}, zone={zone!r}, project={project!r}); "
            f"environment: {environment}.")


_WHAT_TO_DO = (
    "On a Cloud TPU VM pass tpu='local' and install TensorFlow's TPU build "
    "(tensorflow with libtpu). For a TPU node pass tpu='NAME', zone='ZONE', "
    "project='PROJECT' (or set TPU_NAME) and `pip install cloud-tpu-client`. "
    "Without a TPU, train with make_strategy('one_device') or "
    "make_strategy('mirrored', ...) and static_shapes=True (the same padded, "
    "XLA-compiled path), and check the model with tfdist.tpu.preflight."
)


def _connect(tpu, zone, project):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=tpu, zone=zone, project=project)
    if tpu not in (None, "local"):
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return resolver


def resolve_and_initialize(tpu=None, zone=None, project=None, *,
                           timeout_seconds: float = 60.0):
    """The initialized TPU's cluster resolver, found within ``timeout_seconds``.

    Raises:
      TPUNotFoundError: no TPU found, an error while connecting, or no answer
        within ``timeout_seconds`` (the search is then left running in a
        daemon thread: TensorFlow offers no way to cancel it).
    """
    _check_arguments(tpu, zone, project, timeout_seconds)
    attempt = describe_attempt(tpu, zone, project)
    if tpu == "local" and not local_tpu_devices():
        # Checked before TensorFlow is asked: its search would start a
        # server and can wait on a runtime that never comes up.
        raise TPUNotFoundError(
            f"No TPU found: tpu='local' but this machine has no TPU devices "
            f"({' or '.join(LOCAL_TPU_DEVICE_PATTERNS)} absent). {attempt} {_WHAT_TO_DO}")
    outcome = {}

    def search():
        try:
            outcome["resolver"] = _connect(tpu, zone, project)
        except BaseException as error:  # pylint: disable=broad-except
            outcome["error"] = error

    thread = threading.Thread(target=search, name="tfdist-tpu-search", daemon=True)
    thread.start()
    thread.join(timeout_seconds)
    if thread.is_alive():
        raise TPUNotFoundError(
            f"No TPU answered within {timeout_seconds:g} s (timeout_seconds). "
            f"{attempt} {_WHAT_TO_DO}")
    if "error" in outcome:
        error = outcome["error"]
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise TPUNotFoundError(
            f"No TPU found: {type(error).__name__}: {first_line[:300]} "
            f"{attempt} {_WHAT_TO_DO}") from error
    return outcome["resolver"]


def tpu_strategy(tpu: Optional[str] = None, zone: Optional[str] = None,
                 project: Optional[str] = None, *, timeout_seconds: float = 60.0
                 ) -> tf.distribute.Strategy:
    """A ``TPUStrategy`` over the TPU found as described in the module docstring.

    The factory ``make_strategy("tpu", **options)`` calls: programs call
    `tfdist.make_strategy`. The Trainer then takes the static-shape path
    (`tfdist.replica.static_shapes`) by itself.

    >>> import tfdist
    >>> strategy = tfdist.make_strategy("tpu", tpu="local")   # doctest: +SKIP
    """
    resolver = resolve_and_initialize(tpu, zone, project, timeout_seconds=timeout_seconds)
    return tf.distribute.TPUStrategy(resolver)
