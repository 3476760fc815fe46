"""The contenders: each builds a ``run(steps)`` that trains ``steps`` steps.

Every contender trains the same compiled model (fresh, same seed) on the
same endless global-batch dataset with the same ``steps_per_execution``, and
starts a new iterator per ``run`` call, as an epoch does:

  tfdist         `tfdist.Trainer.fit` (metrics read at its log points)
  tfdist_attach  `tfdist.attach(model)` then Keras' own ``model.fit`` call
  keras_fit      Keras 3 ``model.fit``
  custom_loop    hand-written, the best plain TensorFlow we can write:
                 ``strategy.run`` in one ``tf.function`` per execution with a
                 ``tf.range`` loop, ``experimental_distribute_dataset``,
                 ``tf.nn.compute_average_loss`` with the global batch, loss
                 and accuracy metrics updated but never read. Under
                 ParameterServerStrategy: a ``ClusterCoordinator`` schedules
                 the same execution on per-worker datasets.
  tfdist_loop    (optional) a custom loop on tfdist's public layer
                 (`tfdist.loops.host_loop.HostLoop` + `tfdist.replica.losses.replica_loss` ...)
  tfdist_eager   (optional) `Trainer.fit` reading metrics after every
                 execution (``log_every_steps=1``): what lazy metrics save
  tfdist_epoch_logs (optional) `Trainer.fit` reading metrics only at the
                 epoch's end: what the log points cost
  custom_loop_tfdist_data (optional) the hand-written loop reading
                 tfdist's data instead of its own: `tfdist.data.distribute`
                 (a global-count column, a prefetch) or, under parameter
                 servers, tfdist's per-worker streams
                 (`tfdist.data.worker_stream`: each worker reads the stream
                 and keeps its share): what tfdist's data costs, apart from
                 its step
  tfdist_step    (optional) the hand-written loop on tfdist's data running
                 tfdist's replica step (`tfdist.replica.step.ReplicaSteps.train`:
                 masks, global counts, exact loss shares, metric totals)
                 instead of its own. With the two above it splits tfdist's
                 distance to the loop into its data (custom_loop_tfdist_data),
                 its step (tfdist_step) and the Trainer's host work (tfdist)
"""

from bench import workloads

DEFAULT = ("tfdist", "tfdist_attach", "keras_fit", "custom_loop")
OPTIONAL = ("tfdist_loop", "tfdist_eager", "tfdist_epoch_logs", "custom_loop_tfdist_data",
            "tfdist_step")
REFERENCE = "custom_loop"
# Not run under parameter servers: Keras 3's trainer has no
# ParameterServerStrategy path (no ClusterCoordinator anywhere in
# keras/src/trainers or backend/tensorflow/trainer.py, 3.15), `attach` runs
# the same Trainer as `tfdist`, and HostLoop is for synchronous strategies.
NOT_UNDER_PS = ("keras_fit", "tfdist_attach", "tfdist_loop")


def builders(strategy, model_name: str, batch_size: int, steps_per_execution: int,
             names=DEFAULT) -> dict:
    """``{name: build}``; ``build()`` returns ``run(steps)``. Building (model,
    tracing) happens in ``build`` so that it can be timed and fail alone."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    parameter_server = isinstance(
        strategy, tf.distribute.experimental.ParameterServerStrategy)
    spe = steps_per_execution
    dataset = workloads.endless_dataset(model_name, batch_size)

    def model():
        return workloads.compiled_model(strategy, model_name, spe)

    def tfdist_fit(log_every_steps=100):
        import tfdist  # pylint: disable=import-outside-toplevel

        trainer = tfdist.Trainer(model(), strategy,
            reporting=tfdist.ReportingOptions(log_every_steps=log_every_steps))
        return lambda steps: trainer.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)

    def tfdist_attach():
        import tfdist  # pylint: disable=import-outside-toplevel

        attached = tfdist.attach(model(), strategy)
        return lambda steps: attached.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)

    def keras_fit():
        compiled = model()
        return lambda steps: compiled.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)

    def custom_loop():
        if parameter_server:
            return _coordinator_loop(strategy, model(), model_name, batch_size, spe)
        return _distributed_loop(strategy, model(), dataset, batch_size, spe)

    def tfdist_loop():
        return _tfdist_loop(strategy, model(), dataset, spe)

    def custom_loop_tfdist_data():
        if parameter_server:
            return _coordinator_loop(strategy, model(), model_name, batch_size, spe,
                                     tfdist_streams=True)
        return _distributed_loop(strategy, model(), dataset, batch_size, spe,
                                 tfdist_data=True)

    def tfdist_step():
        step = _tfdist_replica_step(strategy, model(), dataset)
        if parameter_server:
            return _coordinator_loop(strategy, None, model_name, batch_size, spe,
                                     tfdist_streams=True, replica_step=step)
        return _distributed_loop(strategy, None, dataset, batch_size, spe,
                                 tfdist_data=True, replica_step=step)

    every = {
        "tfdist": tfdist_fit,
        "tfdist_attach": tfdist_attach,
        "keras_fit": keras_fit,
        "custom_loop": custom_loop,
        "tfdist_loop": tfdist_loop,
        "tfdist_eager": lambda: tfdist_fit(log_every_steps=1),
        "tfdist_epoch_logs": lambda: tfdist_fit(log_every_steps=10**9),
        "custom_loop_tfdist_data": custom_loop_tfdist_data,
        "tfdist_step": tfdist_step,
    }
    unknown = sorted(set(names) - set(every))
    if unknown:
        raise ValueError(f"--contenders: unknown {unknown}; known: {sorted(every)}.")
    if parameter_server:
        names = [name for name in names if name not in NOT_UNDER_PS]
    return {name: every[name] for name in names}


def _replica_step(model, batch_size):
    """The hand-written replica step: loss scaled by the GLOBAL batch.
    Call under the strategy's scope (optimizer and metric variables)."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    model.optimizer.build(model.trainable_variables)  # before tracing
    loss_mean = keras.metrics.Mean()
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="none")

    # Without this, autograph converts Keras 3's optimizer code, and under
    # MirroredStrategy inside a tf.range loop that fails with "You must feed
    # a value for placeholder tensor 'cond/else/...'".
    @tf.autograph.experimental.do_not_convert
    def replica_step(inputs):
        # (features, labels), or a `tfdist.Batch` structure (its x and y).
        features, labels = (inputs["x"], inputs["y"]) if isinstance(inputs, dict) else inputs
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            per_example = loss_fn(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch_size)
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        loss_mean.update_state(per_example)  # updated every step,
        accuracy.update_state(labels, predictions)  # never read here

    return replica_step


def _tfdist_replica_step(strategy, model, dataset):
    """tfdist's own replica step for ``model`` (what `tfdist.Trainer` runs),
    its model, optimizer and metric state built from ``dataset``'s spec (as
    the Trainer builds them: `tfdist._internal.keras.model_state.build_model_state`)."""
    from tfdist._internal.keras import model_state as keras_model_state  # pylint: disable=import-outside-toplevel
    from tfdist.replica.metrics import MetricState  # pylint: disable=import-outside-toplevel
    from tfdist.replica.step import ReplicaSteps  # pylint: disable=import-outside-toplevel
    from tfdist.parallel.plan import WHOLE  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        keras_model_state.build_model_state(model, dataset.element_spec)
        return ReplicaSteps(model, MetricState(model, strategy), jit_compile=False,
                            plan=WHOLE).train


def _distributed_loop(strategy, model, dataset, batch_size, spe, tfdist_data=False,
                      replica_step=None):
    """The hand-written synchronous loop; ``replica_step`` (default: its
    own, for ``model``) takes one replica's batch."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if replica_step is None:
        with strategy.scope():
            replica_step = _replica_step(model, batch_size)
    if tfdist_data:
        import tfdist  # pylint: disable=import-outside-toplevel

        distributed = tfdist.data.distribute(strategy, dataset, avoid_empty_replicas=True)
    else:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        distributed = strategy.experimental_distribute_dataset(dataset.with_options(options))

    @tf.function
    def execution(iterator, num_steps):
        for _ in tf.range(num_steps):
            strategy.run(replica_step, args=(next(iterator),))

    num_steps = tf.constant(spe)

    def run(steps):
        iterator = iter(distributed)
        for _ in range(steps // spe):
            execution(iterator, num_steps)

    return run


def _coordinator_loop(strategy, model, model_name, batch_size, spe, tfdist_streams=False,
                      replica_step=None):
    """TensorFlow's parameter-server tutorial loop, steps_per_execution steps
    per scheduled closure; every worker reads whole global batches (or, with
    ``tfdist_streams``, its share of tfdist's worker streams). ``replica_step``
    as in `_distributed_loop`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    if replica_step is None:
        with strategy.scope():
            replica_step = _replica_step(model, batch_size)
    if tfdist_streams:
        import tfdist  # pylint: disable=import-outside-toplevel
        from tfdist.loops.runners.per_worker import PerWorkerIterators, rebuilder  # pylint: disable=import-outside-toplevel

        rebuild = rebuilder(workloads.endless_dataset(model_name, batch_size))
        new_iterators = PerWorkerIterators(
            coordinator, lambda worker, workers: tfdist.data.worker_stream(
                rebuild(), worker, workers, global_batch_size=batch_size))
    else:
        # The dataset is made on each worker (one made here would be the
        # coordinator's, which workers cannot read).
        per_worker = coordinator.create_per_worker_dataset(
            lambda: workloads.endless_dataset(model_name, batch_size))
        new_iterators = lambda: iter(per_worker)  # noqa: E731

    @tf.function
    def execution(iterator):
        for _ in tf.range(spe):
            strategy.run(replica_step, args=(next(iterator),))

    def run(steps):
        iterator = new_iterators()
        for _ in range(steps // spe):
            coordinator.schedule(execution, args=(iterator,))
        coordinator.join()

    return run


def _tfdist_loop(strategy, model, dataset, spe):
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel

    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
        loss_mean = keras.metrics.Mean(name="loss")
        accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)

    def replica_step(batch):
        with tf.GradientTape() as tape:
            predictions = model(batch.x, training=True)
            per_example = loss_fn(batch.y, predictions)
            loss = tfdist.replica.losses.replica_loss(per_example, batch, model)
        tfdist.replica.metrics.update_loss_mean(loss_mean, per_example, batch, model)
        tfdist.replica.metrics.update_metrics([accuracy], batch, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        tfdist.replica.gradients.apply_gradients(model.optimizer, gradients, model.trainable_variables)

    loop = tfdist.loops.host_loop.HostLoop(strategy, replica_step, steps_per_execution=spe)
    batches = tfdist.data.distribute(strategy, dataset, avoid_empty_replicas=True)

    def run(steps):
        iterator = iter(batches)
        for _ in range(steps // spe):
            loop.run(iterator)

    return run
