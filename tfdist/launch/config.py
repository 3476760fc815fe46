"""`LaunchConfig`: everything `launch` needs, validated once."""

import dataclasses
from typing import Optional, Tuple

from tfdist.errors import ConfigurationError
from tfdist.launch.network import bits_per_second


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """A local cluster to start.

    Attributes:
      num_workers: worker tasks. Without ps tasks each runs the command
        (MultiWorkerMirroredStrategy); with them, each runs a server.
      num_ps: parameter-server tasks (servers); when set, the command runs
        once, as the chief (the coordinator).
      workers_serve: the command runs once, as a chief, and the worker
        tasks run servers the chief places work on (no ps tasks): a
        pipeline's stages, one per task (`tfdist.parallel.cluster_stages`).
        A stage's server holds its weights, so one that exits fails the
        group (no respawn); ``max_restarts`` resumes from the checkpoint.
      data_service_workers: tf.data service workers to run beside the
        training tasks, with a dispatcher (0: none). Every training task gets
        the dispatcher's address in ``TFDIST_DATA_SERVICE``
        (`tfdist.data.service`). They are servers: one that exits fails the
        group (a restart starts them all again).
      evaluator: also run an ``evaluator`` task: the same command, with a
        TF_CONFIG naming it ``evaluator``, which evaluates each checkpoint
        beside training (`tfdist.training.sidecar`). It is not part of the
        cluster: it never fails or stops the group, which waits for it at
        the end for at most ``evaluator_timeout`` seconds.
      max_worker_respawns: with ps tasks and 2+ workers, how often a dead
        or hung worker server is started again (the coordinator moves its
        steps to the other workers). With one worker a lost worker fails the
        group instead: a respawned worker would re-run its unfinished steps
        from a fresh iterator (at-least-once, not exact), while a restart
        (``max_restarts``) resumes from the checkpoint exactly.
      max_restarts: restarts of the whole group after a task fails.
      min_workers: elastic shrink (no ps tasks): a worker that dies before
        joining the cluster on a restart is lost, and the group restarts
        with one worker fewer, never fewer than this. None: ``num_workers``
        (no shrinking). Joins are reported through ``TFDIST_READY_FILE``,
        so shrinking needs ``start_timeout`` > 0.
      host_discovery: elastic growth (no ps tasks): a script that says how
        many workers can run (`tfdist.launch.discovery`), run every
        ``discovery_interval`` seconds. The group starts at its answer
        (between ``min_workers`` and ``num_workers``), and when the answer
        changes it is stopped (every worker saves a checkpoint at one step)
        and started again at the new size, resuming from that checkpoint.
      discovery_interval: seconds between two runs of ``host_discovery``.
      log_dir: if set, each task's output also goes to ``<log_dir>/<task>.log``.
      start_timeout: seconds for every task to join the cluster (to report
        through ``TFDIST_READY_FILE``, as `tfdist.make_strategy` does);
        0 disables the check.
      grace_period: seconds between SIGTERM and SIGKILL when ending tasks;
        also how long a stop asked for with SIGTERM / Ctrl-C may take.
      hang_timeout: a task stopped (SIGSTOP) this many seconds is hung: the
        run fails naming it (0: never).
      ports: fixed ports (one per task); default: free ports, new each start.
      host: address the tasks bind to; loopback, since TensorFlow's gRPC
        servers have no authentication.
      bandwidth: a tc rate (``"1gbit"``): every task runs in a network
        namespace whose loopback is limited to it (`tfdist.launch.network`;
        ``tfdist-run --bandwidth`` makes the namespace). None: no limit.

    >>> from tfdist.launch import LaunchConfig
    >>> config = LaunchConfig(num_workers=2, num_ps=1)    # tfdist-run --num_workers=2 --num_ps=1
    >>> config.num_tasks                                  # and a chief: the coordinator
    4
    >>> elastic = LaunchConfig(num_workers=4, min_workers=3)  # tfdist-run --min_workers=3
    >>> config.fewest_workers, elastic.fewest_workers         # the size a restart may shrink to
    (2, 3)
    """

    num_workers: int
    num_ps: int = 0
    workers_serve: bool = False
    data_service_workers: int = 0
    evaluator: bool = False
    evaluator_timeout: float = 120.0
    max_worker_respawns: int = 3
    max_restarts: int = 0
    min_workers: Optional[int] = None
    host_discovery: Optional[str] = None
    discovery_interval: float = 5.0
    log_dir: Optional[str] = None
    start_timeout: float = 180.0
    grace_period: float = 15.0
    hang_timeout: float = 20.0
    ports: Optional[Tuple[int, ...]] = None
    host: str = "127.0.0.1"
    bandwidth: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ConfigurationError(
                f"`num_workers` ({self.num_workers!r}) must be a positive integer."
            )
        if not isinstance(self.num_ps, int) or self.num_ps < 0:
            raise ConfigurationError(f"`num_ps` ({self.num_ps!r}) must be 0 or more.")
        if (not isinstance(self.data_service_workers, int) or isinstance(self.data_service_workers, bool)
                or self.data_service_workers < 0):
            raise ConfigurationError(
                f"`data_service_workers` ({self.data_service_workers!r}) must be 0 (no "
                "tf.data service) or a number of service workers, e.g. --data_service_workers=1.")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigurationError(
                f"`max_restarts` ({self.max_restarts!r}) must be 0 or more."
            )
        self._check_min_workers()
        if self.workers_serve and (self.num_ps or self.min_workers is not None
                                   or self.host_discovery is not None):
            raise ConfigurationError(
                "`workers_serve` runs a chief and worker servers that hold a pipeline's "
                "stages; it does not combine with ps tasks (they serve already) or with "
                "elastic sizes (a stage cannot be dropped). Drop --num_ps, --min_workers "
                "and --host_discovery.")
        if self.bandwidth is not None:
            bits_per_second(self.bandwidth)  # a clear error for a bad rate
        if self.host_discovery is not None and self.num_ps:
            raise ConfigurationError(
                f"`host_discovery` ({self.host_discovery!r}) resizes multi-worker training "
                "without ps tasks; with parameter servers the coordinator already uses the "
                "workers that are there. Drop --host_discovery or --num_ps.")
        if self.discovery_interval <= 0:
            raise ConfigurationError(
                f"`discovery_interval` ({self.discovery_interval}) must be a positive number "
                "of seconds.")
        for name in ("start_timeout", "grace_period", "hang_timeout", "evaluator_timeout"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"`{name}` ({getattr(self, name)}) must be 0 or more seconds."
                )
        if self.ports is not None and len(self.ports) != self.num_tasks:
            raise ConfigurationError(
                f"`ports` has {len(self.ports)} entries for {self.num_tasks} tasks; "
                "give one port per task, or none for free ports."
            )

    def _check_min_workers(self) -> None:
        value = self.min_workers
        if value is None:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigurationError(
                f"`min_workers` ({value!r}) must be a positive integer: the fewest "
                f"workers training may shrink to (at most --num_workers={self.num_workers})."
            )
        if value > self.num_workers:
            raise ConfigurationError(
                f"`min_workers` ({value}) is more than `num_workers` ({self.num_workers}); "
                f"give --min_workers between 1 and {self.num_workers}."
            )
        if self.num_ps and value < self.num_workers:
            raise ConfigurationError(
                f"`min_workers` ({value}) is for multi-worker training without ps "
                "tasks; with parameter servers the coordinator already moves a lost "
                "worker's steps to the others. Drop --min_workers or --num_ps."
            )

    @property
    def has_chief(self) -> bool:
        """Whether the command runs once, as a chief, and the workers serve."""
        return bool(self.num_ps) or self.workers_serve

    @property
    def fewest_workers(self) -> int:
        """The size the group may shrink to (``num_workers`` if not elastic)."""
        return self.num_workers if self.min_workers is None else self.min_workers

    @property
    def num_tasks(self) -> int:
        """Workers, plus a chief and the ps tasks in parameter-server mode,
        plus a dispatcher and the tf.data service workers."""
        return (self.num_workers + (1 + self.num_ps if self.num_ps else 0)
                + (1 if self.workers_serve else 0)
                + (1 + self.data_service_workers if self.data_service_workers else 0))
