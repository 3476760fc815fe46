"""Strategies on one machine: one device, or mirrored over local devices.

On a machine without GPUs, ``mirrored(num_replicas=4)`` splits the CPU into 4
logical devices so that multi-replica code (and its tests) runs on a laptop.
Logical devices can only be configured before the TensorFlow runtime starts;
asking for more replicas after that raises `RuntimeAlreadyStartedError`,
which says to call `make_strategy` first.
"""

import glob
import os
import warnings
from typing import Optional, Sequence

import tensorflow as tf

from tfdist import cluster

from tfdist._internal import runtime_start, tf_logs
from tfdist.errors import ConfigurationError, RuntimeAlreadyStartedError

_CROSS_DEVICE_OPS = {
    "auto": lambda: None,
    "nccl": lambda: tf.distribute.NcclAllReduce(),
    "hierarchical_copy": lambda: tf.distribute.HierarchicalCopyAllReduce(),
    "reduce_to_one_device": lambda: tf.distribute.ReductionToOneDevice(),
}


def physical_devices(kind: str) -> list:
    """``tf.config.list_physical_devices(kind)``; the first call starts the
    runtime, whose start-up lines (a CPU-only machine's failed cuInit) are
    noise (`tfdist._internal.tf_logs`). No GPU on a machine that has NVIDIA
    GPUs is a warning with TensorFlow's reason (`warn_if_gpus_failed`)."""
    with tf_logs.quietly():
        devices = tf.config.list_physical_devices(kind)
    if kind == "GPU" and not devices:
        warn_if_gpus_failed()
    return devices


def nvidia_gpus_present() -> Optional[str]:
    """What shows this machine has NVIDIA GPUs the process may use (the
    driver's device files), or None; None too when ``CUDA_VISIBLE_DEVICES``
    hides them on purpose."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return None
    found = sorted(glob.glob("/dev/nvidia[0-9]*")) or sorted(glob.glob("/proc/driver/nvidia/gpus/*"))
    return ", ".join(found) if found else None


_warned = []


def warn_if_gpus_failed(present: Optional[str] = None) -> bool:
    """Warns (once) when the machine has NVIDIA GPUs but TensorFlow found
    none, with the start-up lines that say why; returns whether it warned.
    Training would otherwise run on the CPU without a word."""
    present = present or nvidia_gpus_present()
    if not present or _warned:
        return False
    _warned.append(True)
    reason = "\n  ".join(tf_logs.gpu_lines[-5:]) or (
        "no reason was printed; set TFDIST_TF_LOGS=1 to see TensorFlow's start-up lines")
    warnings.warn(
        f"This machine has NVIDIA GPUs ({present}), but TensorFlow found none, so training "
        f"runs on the CPU. TensorFlow said:\n  {reason}\nCheck the driver and CUDA "
        f"libraries (`nvidia-smi`; a TensorFlow build with CUDA: pip install "
        f"'tensorflow[and-cuda]'), or set CUDA_VISIBLE_DEVICES='' to use the CPU on purpose.",
        RuntimeWarning, stacklevel=3)
    return True


def configure_logical_cpus(num_devices: int) -> list:
    """Ensures the first CPU is split into at least ``num_devices`` logical devices.

    >>> import tfdist
    >>> tfdist.strategies.configure_logical_cpus(2)
    ['/cpu:0', '/cpu:1']

    Returns the names of the first ``num_devices`` logical CPU devices. If the
    runtime already started with enough logical CPUs (e.g. a test process that
    configured 4 and now asks for 2), those are reused.

    Raises:
      ConfigurationError: ``num_devices`` is not a positive integer.
      RuntimeAlreadyStartedError: the runtime started with fewer devices.
    """
    if not isinstance(num_devices, int) or num_devices < 1:
        raise ConfigurationError(
            f"`num_replicas` ({num_devices!r}) must be a positive integer."
        )
    cpu = physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) < num_devices:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
            )
        except RuntimeError as error:
            available = len(tf.config.list_logical_devices("CPU"))
            if available < num_devices:
                started = runtime_start.started_at()
                where = (f"It started at {started}. Move that line (and the TensorFlow work "
                         f"before it) after tfdist.make_strategy(...)" if started else
                         "It started before `import tfdist` could see where (import tfdist "
                         "first to have the line named). Call tfdist.make_strategy(...) before "
                         "any other TensorFlow work (tensors, models, datasets, "
                         "keras.utils.set_random_seed), e.g. first thing in main()")
                raise RuntimeAlreadyStartedError(
                    f"`num_replicas={num_devices}` needs {num_devices} logical CPU devices, "
                    f"but the TensorFlow runtime already started with {available}, and "
                    f"logical devices can only be set before it starts. {where}. (Strategies "
                    f"that fit the devices it has, e.g. num_replicas={available}, work "
                    f"in any order.)"
                ) from error
    return [f"/cpu:{i}" for i in range(num_devices)]


def _cross_device_ops(communication: str):
    if communication not in _CROSS_DEVICE_OPS:
        raise ConfigurationError(
            f"`communication` ({communication!r}) must be one of "
            f"{sorted(_CROSS_DEVICE_OPS)}."
        )
    return _CROSS_DEVICE_OPS[communication]()


def one_device(device: Optional[str] = None) -> tf.distribute.Strategy:
    if device is None:
        gpus = physical_devices("GPU")
        device = "/gpu:0" if gpus else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)


def evaluator_strategy() -> tf.distribute.Strategy:
    """An evaluator task's strategy: one local device, joining no cluster
    (it evaluates the checkpoints the workers write, beside them:
    `tfdist.training.sidecar`). Reports the task ready to ``tfdist-run``."""
    strategy = one_device()
    cluster.signal_ready()
    return strategy


def mirrored(
    num_replicas: Optional[int] = None, communication: str = "auto",
    devices: Optional[Sequence[str]] = None,
) -> tf.distribute.Strategy:
    """All local GPUs (or ``num_replicas`` of them); else logical CPUs.
    ``devices``: the replicas' devices, named (a tensor-parallel mesh's
    first column, `tfdist.parallel.tensor_parallel`); logical CPUs are
    made first when a CPU named is missing."""
    cross_device_ops = _cross_device_ops(communication)
    gpus = physical_devices("GPU")
    if devices is not None:
        if num_replicas is not None and num_replicas != len(devices):
            raise ConfigurationError(
                f"`num_replicas` ({num_replicas}) differs from the {len(devices)} `devices` "
                f"named ({list(devices)}); give one of them.")
        devices = list(devices)
        cpus = [tf.DeviceSpec.from_string(d if d.startswith("/") else "/" + d)
                for d in devices]
        if not gpus:
            configure_logical_cpus(max(1 + (spec.device_index or 0) for spec in cpus))
    elif gpus:
        count = len(gpus) if num_replicas is None else num_replicas
        if count > len(gpus):
            raise ConfigurationError(
                f"`num_replicas` ({count}) exceeds the {len(gpus)} local GPUs."
            )
        devices = [f"/gpu:{i}" for i in range(count)]
    else:
        devices = configure_logical_cpus(
            1 if num_replicas is None else num_replicas
        )
    _new_collective_key_range(tf.distribute.MirroredStrategy)
    return tf.distribute.MirroredStrategy(
        devices=devices, cross_device_ops=cross_device_ops
    )


def _new_collective_key_range(strategy_class) -> None:
    """Gives the next strategy of ``strategy_class`` its own collective keys.

    Every MirroredStrategy numbers its collective groups from the same start,
    so two strategies over overlapping devices with different replica counts
    in one process (a notebook, a test session, 4 then 2 replicas) collide:
    "Device CPU:1 is joining a group with size 3, but that group has size 2".
    TensorFlow's own tests avoid it by moving this (private) base; so do we.
    """
    strategy_class._collective_key_base += 100_000
