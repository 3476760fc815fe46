"""tfdist-run: a local multi-worker cluster from one command (see `cli`).

Layers, each usable on its own: `cli.main(argv)` -> `LaunchConfig` ->
`launch(config, command)` -> `ProcessGroup` (start / wait / close).
"""

from tfdist.launch.cli import main
from tfdist.launch.config import LaunchConfig
from tfdist.launch.group import ProcessGroup
from tfdist.launch.tasks import GroupResult, TaskSpec
from tfdist.launch.launcher import launch

__all__ = ["GroupResult", "LaunchConfig", "ProcessGroup", "TaskSpec", "launch", "main"]
