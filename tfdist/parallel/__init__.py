"""Model parallelism: a model split over several devices.

`Pipeline` cuts a model into stages after named layers, one stage per
device, and runs each batch as micro-batches flowing through them, in the
GPipe or 1F1B schedule (`tfdist.parallel.pipeline`,
`tfdist.parallel.schedules`). Pass it as ``parallel=`` to `tfdist.attach`
or `tfdist.Trainer`. The devices are this process's (logical CPUs, GPUs)
or one per task of a cluster (`task_devices`, from
`tfdist.parallel.cluster_stages`).

A ``keras.distribution.ModelParallel`` passed as ``parallel=`` splits
weights over a mesh's model axis (`tfdist.parallel.tensor_parallel`);
`mesh_devices` lists a strategy's mesh, over workers too.

>>> import tfdist
>>> tfdist.parallel.Pipeline(cuts=["encoder"], micro_batches=4)
Pipeline(cuts=['encoder'], micro_batches=4, schedule='1f1b')
"""

from tfdist._internal import lazy

_NAMES = {"Pipeline": "tfdist.parallel.pipeline",
          "mesh_devices": "tfdist.parallel.mesh_rows",
          "task_devices": "tfdist.parallel.cluster_stages"}
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
