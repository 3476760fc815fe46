"""`Execution`: what a run of steps did, the one record a hand-written
loop's `tfdist.loops.host_loop.HostLoop.run` and the Trainer's runners
(`tfdist.loops.runners`) return. Its public path is
`tfdist.loops.host_loop.Execution`.

>>> from tfdist.loops.execution import Execution
>>> Execution(steps=3, end_of_data=True)
Execution(steps=3, stop=False, end_of_data=True)
"""

from typing import NamedTuple


class Execution(NamedTuple):
    """What a run of steps did: one `HostLoop.run`, or a runner's
    ``train`` over a plan's executions (one record, so a hand-written loop
    and the Trainer read the same fields).

    Attributes:
      steps: steps run (fewer than asked when the data ended).
      stop: every worker agreed to stop after these steps (a SIGTERM or
        Ctrl-C on any of them: `tfdist.loops.preemption`).
      end_of_data: the data ended (an execution ran fewer steps than asked).
    """

    steps: int
    stop: bool = False
    end_of_data: bool = False
