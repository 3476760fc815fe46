"""What crosses the network between replicas, and how much of it.

`Compression` halves the bytes of the gradient all-reduce by casting
gradients to bfloat16 or float16 for the exchange (`tfdist.communication.compression`).
`LocalSGD` all-reduces the weights every H steps instead of the gradients
every step (`tfdist.communication.local_sgd`); `Gossip` averages each
replica's weights with its neighbours' after every step, never with
everyone (`tfdist.communication.gossip`). `ShardedOptimizerState`
keeps 1/N of the optimizer's state on each replica (`tfdist.communication.sharding`);
`FullySharded` also 1/N of every weight and gradient (`tfdist.communication.fully_sharded`).
Pass one (or a tuple) as
``communication=`` to `tfdist.Trainer` or `tfdist.attach`; the Trainer
holds what was asked for as one `tfdist.communication.plan.Communication`
(a no-op by default).

>>> import tfdist
>>> tfdist.communication.Compression("bf16")
Compression('bf16')
"""

from tfdist._internal import lazy

_NAMES = {"Compression": "tfdist.communication.compression",
          "FullySharded": "tfdist.communication.fully_sharded",
          "Gossip": "tfdist.communication.gossip",
          "LocalSGD": "tfdist.communication.local_sgd",
          "ShardedOptimizerState": "tfdist.communication.sharding"}
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
