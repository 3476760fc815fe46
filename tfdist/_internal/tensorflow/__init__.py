"""Every place tfdist relies on a TensorFlow internal that has no public
name, one module per job, behind named functions:

- `distributed_variables`: a mirrored variable whose copies live on
  devices of tfdist's choosing (a pipeline stage's weights);
- `multi_worker_devices`: a MultiWorkerMirroredStrategy on logical CPUs;
- `coordination`: the coordination service's heartbeats (a lost peer);
- `cluster_views`: which tasks a worker server sees (pipelines on tasks);
- `sharded_variables`: ParameterServerStrategy's ShardedVariable updated
  and saved whole;
- `coordinator_workers`: a ClusterCoordinator's workers and a dataset's
  variant (the parameter-server runners);
- `checkpoint_internals`: a checkpoint's saver and background writer;
- `trackable_lists`: the lists a checkpoint tracks.

The rest of the ground floor (`tfdist._internal`: collectives, checkpoint
keys, host copies, graph order, runtime start) reads TensorFlow internals
where it uses them; no module above it does. `privates` lists every
internal module tfdist imports (what it takes, who reads it) and the
private attributes read here; `tests/_internal/test_tensorflow_contract.py`
checks each import, so a TensorFlow upgrade that moves one fails there
first, naming it and the module to update, and `tests/test_architecture.py`
fails on an unlisted import, or one outside `tfdist/_internal/`.
"""
