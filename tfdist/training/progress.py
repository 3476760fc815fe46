"""Progress lines and TensorBoard summaries, written only at log points.

Log lines have one greppable shape:

    train | epoch 2 | step 120/400 | loss 0.3100 | accuracy 0.9100 | 850 ex/s

Summaries follow the Keras TensorBoard callback's layout, so existing
dashboards work: ``<log_dir>/train`` and ``<log_dir>/validation`` hold
``epoch_loss``, ``epoch_accuracy``, ... per epoch; ``<log_dir>/train`` also
holds ``batch_loss``, ... at each log point, indexed by global step.
"""

import sys
import time
from typing import Dict, Optional

import tensorflow as tf

from tfdist._internal import host_values


def format_line(
    phase: str,
    epoch: int,
    step: Optional[int],
    total_steps: Optional[int],
    values: Dict[str, float],
    examples_per_second: Optional[float] = None,
) -> str:
    """``train | epoch 2 | step 120/400 | loss 0.3100 | ... | 850 ex/s``."""
    parts = [phase, f"epoch {epoch}"]
    if step is not None:
        total = "?" if total_steps is None else str(total_steps)
        parts.append(f"step {step}/{total}")
    parts += [f"{name} {value:.4f}" for name, value in values.items()]
    if examples_per_second is not None:
        parts.append(f"{examples_per_second:.0f} ex/s")
    return " | ".join(parts)


def _emit(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


class ProgressReporter:
    """Emits log lines (``verbose >= 1``) and summaries (``log_dir`` set)."""

    def __init__(self, *, verbose: int, log_dir: Optional[str]):
        self._verbose = verbose
        self._writers = {}
        self._log_dir = log_dir
        self._last_time = None
        self._last_examples = 0.0

    def _writer(self, name: str):
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(
                f"{self._log_dir}/{name}"
            )
        return self._writers[name]

    def start_epoch(self) -> None:
        self._last_time = time.perf_counter()
        self._last_examples = 0.0

    def _throughput(self, examples_seen: float) -> Optional[float]:
        now = time.perf_counter()
        elapsed = now - self._last_time if self._last_time else 0.0
        rate = (examples_seen - self._last_examples) / elapsed if elapsed else None
        self._last_time, self._last_examples = now, examples_seen
        return rate

    def log_point(self, *, epoch, step_in_epoch, total_steps, global_step,
                  values, examples_seen) -> None:
        """Reports mid-epoch training progress."""
        rate = self._throughput(examples_seen)
        if self._verbose:
            _emit(format_line(
                "train", epoch + 1, step_in_epoch, total_steps, values, rate))
        if self._log_dir:
            with self._writer("train").as_default(step=host_values.int64(global_step)):
                for name, value in values.items():
                    tf.summary.scalar(f"batch_{name}", host_values.float32(value))

    def epoch_end(self, *, epoch, steps, logs: Dict[str, float]) -> None:
        """Reports an epoch's results (``val_*`` entries go to validation)."""
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        val = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        if self._verbose:
            _emit(format_line("train", epoch + 1, steps, steps, train))
            if val:
                _emit(format_line("eval", epoch + 1, None, None, val))
        if self._log_dir:
            for writer_name, values in (("train", train), ("validation", val)):
                if not values:
                    continue
                with self._writer(writer_name).as_default(step=host_values.int64(epoch)):
                    for name, value in values.items():
                        tf.summary.scalar(f"epoch_{name}", host_values.float32(value))
                self._writer(writer_name).flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
