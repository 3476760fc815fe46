"""How steps are dispatched and when things happen.

For a hand-written loop: `tfdist.loops.host_loop.HostLoop` (k steps per host
call) and `tfdist.loops.preemption.PreemptionWatcher` (SIGTERM / Ctrl-C as
a flag, `tfdist.Preempted` to stop). The Trainer's internals: one runner per
strategy family (`tfdist.loops.runners`), the pure arithmetic of log, save
and epoch points (`tfdist.loops.cadence`) and stop agreement across workers
(`tfdist.loops.agreement`).

>>> import tfdist
>>> with tfdist.loops.preemption.PreemptionWatcher() as stop_signal:
...     stop_signal.requested
False
"""

from tfdist._internal import lazy

__all__ = ["host_loop", "parameter_server_loop", "preemption"]  # public modules
__getattr__ = lazy.attributes(__name__, {})
