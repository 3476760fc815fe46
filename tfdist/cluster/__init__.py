"""Who am I in the cluster: ``TF_CONFIG`` parsed, validated and built
(`tfdist.cluster.tf_config`), this process's rank, size and local rank
among the training processes (`tfdist.cluster.process`, Horovod's
``hvd.rank()`` and friends), platform resolvers (Slurm, TFJob, Vertex,
SageMaker: `tfdist.cluster.platforms`), and lost-task detection
(`tfdist.cluster.peers`). Nothing here imports TensorFlow but ``peers``.

>>> from tfdist import cluster
>>> config = cluster.build_tf_config({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, "worker", 1)
>>> cluster.task_name(config)
'worker-1'
>>> cluster.JOB_NAMES          # the jobs a TF_CONFIG may name
('chief', 'worker', 'ps', 'evaluator')
>>> cluster.READY_FILE_ENV     # tfdist-run sets it per task; `signal_ready` writes that file
'TFDIST_READY_FILE'
"""

from tfdist._internal import lazy

_NAMES = {name: "tfdist.cluster.tf_config" for name in (
    "JOB_NAMES", "READY_FILE_ENV", "TFConfig", "build_tf_config", "is_chief", "num_workers",
    "parse_tf_config", "signal_ready", "task_id", "task_name", "task_type", "validate",
)}
_NAMES.update({name: "tfdist.cluster.process" for name in (
    "TrainingProcess", "training_process")})
# Every resolver returns a TFConfig (`tfdist.cluster.platforms`).
_NAMES.update({name: "tfdist.cluster.platforms" for name in (
    "expand_slurm_nodelist", "from_sagemaker", "from_slurm", "from_tfjob", "from_vertex",
    "platform_tf_config", "slurm_base_port",
)})
__all__ = sorted(_NAMES)
__getattr__ = lazy.attributes(__name__, _NAMES)
