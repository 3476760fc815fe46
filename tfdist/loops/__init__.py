"""How steps are dispatched and when things happen: host loops of k steps per
call (`tfdist.loops.host_loop`), one runner per strategy family
(`tfdist.loops.runners`), the pure arithmetic of log, save and epoch points
(`tfdist.loops.cadence`), stop agreement across workers
(`tfdist.loops.agreement`) and preemption signals
(`tfdist.loops.preemption`)."""

from tfdist._internal import lazy

__getattr__ = lazy.attributes(__name__, {})
