"""What `tfdist.tpu.preflight` found: problems (the step would not run on a
TPU), each with its fix, and advice (it runs, but leaves the TPU partly
idle), each with what to change."""

import dataclasses
from typing import List


@dataclasses.dataclass(frozen=True)
class _Finding:
    """What a problem and an advice share: the class of finding, where it
    was seen and what was seen; each adds what to do about it."""

    check: str
    where: str
    detail: str

    def _line(self, label: str, remedy: str) -> str:
        return f"[{self.check}] {self.where}: {self.detail} {label}: {remedy}"


@dataclasses.dataclass(frozen=True)
class Problem(_Finding):
    """One reason the step would not compile, or would run badly, on a TPU.

    ``check`` is the class of problem (e.g. "dynamic shape", "host-only op",
    "float64"), ``where`` the layer, op or data component, ``detail`` what
    was seen and ``fix`` what to change.

    >>> from tfdist.tpu.report import Problem
    >>> print(Problem("float64", "data x", "is float64; TPUs have no float64.",
    ...               "cast it to float32."))
    [float64] data x: is float64; TPUs have no float64. Fix: cast it to float32.
    """

    fix: str

    def __str__(self) -> str:
        return self._line("Fix", self.fix)


@dataclasses.dataclass(frozen=True)
class Advice(_Finding):
    """Something that runs on a TPU but wastes it (e.g. a per-core batch
    the matrix unit pads), and what to change.

    >>> from tfdist.tpu.report import Advice
    >>> print(Advice("batch size", "data", "the per-core batch is 2; the TPU pads it to 8.",
    ...              "use a global batch of 64."))
    [batch size] data: the per-core batch is 2; the TPU pads it to 8. Better: use a global batch of 64.
    """

    change: str

    def __str__(self) -> str:
        return self._line("Better", self.change)


@dataclasses.dataclass
class PreflightReport:
    """The preflight's findings. ``ok``: the step will run on a TPU (no
    problems). ``advice`` lists what runs but wastes the TPU (batch sizes
    the matrix unit pads), and never makes ``ok`` false; ``notes`` say how
    the preflight read the data.

    >>> from tfdist.tpu.report import PreflightReport
    >>> report = PreflightReport(num_replicas=8, per_replica_batch_size=2, compiled=True)
    >>> report.advise("batch size", "data", "the per-core batch is 2.", "use 64.")
    >>> report.ok
    True
    >>> report.add("float64", "data x", "is float64.", "cast it to float32.")
    >>> print(report)
    TPU preflight: 1 problem(s) (8 replicas, per-replica batch 2, XLA compile passed)
      - [float64] data x: is float64. Fix: cast it to float32.
      advice: [batch size] data: the per-core batch is 2. Better: use 64.
    """

    num_replicas: int
    per_replica_batch_size: int = 0
    compiled: bool = False
    problems: List[Problem] = dataclasses.field(default_factory=list)
    advice: List[Advice] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, check: str, where: str, detail: str, fix: str) -> None:
        """Adds a problem unless the same check already named ``where``."""
        if any(p.check == check and p.where == where for p in self.problems):
            return
        self.problems.append(Problem(check, where, detail, fix))

    def advise(self, check: str, where: str, detail: str, change: str) -> None:
        """Adds advice: the step runs on a TPU, but ``change`` would use it better."""
        self.advice.append(Advice(check, where, detail, change))

    def __str__(self) -> str:
        head = (f"TPU preflight: {'OK' if self.ok else f'{len(self.problems)} problem(s)'}"
                f" ({self.num_replicas} replicas, per-replica batch "
                f"{self.per_replica_batch_size or '?'}, XLA compile "
                f"{'passed' if self.compiled else 'not passed'})")
        lines = [head] + [f"  - {p}" for p in self.problems]
        lines += [f"  advice: {a}" for a in self.advice]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
