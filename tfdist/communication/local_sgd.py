"""Local SGD: each replica steps on its own batches; weights averaged every H steps.

On a slow network the all-reduce of every step's gradients decides the
speed. Local SGD all-reduces less often: each replica (one per worker on
CPU clusters) applies its own gradients to its own copy of the weights,
and every ``every_steps`` steps the replicas average their weights (Lin et
al., "Don't use large mini-batches, use local SGD", ICLR 2020; TF1's
``ModelAverageOptimizer``). The exchange then costs one all-reduce of the
weights per H steps instead of one of the gradients per step.

- **Local steps.** A replica's gradient is scaled to its own batch (times
  the number of replicas: tfdist's losses divide by the global example
  count) and applied without an all-reduce, with the replica's own
  optimizer state (momentum, Adam's moments) between averagings.
- **What is averaged**: the weights and the optimizer's state, so after an
  averaging every replica holds the same model and optimizer (and a
  checkpoint, which keeps one copy, holds all of it). The exchange is the
  weights' bytes plus the optimizer's slots (2x the weights for SGD with
  momentum, 3x for Adam) once per H steps, against the gradients' bytes
  every step for synchronous training.
- **Averaging** runs in the training loop after the step where
  ``(optimizer.iterations - warmup_steps) % every_steps == 0``, and also
  at the end of every epoch and before every checkpoint save, so workers
  end every epoch with identical weights and every checkpoint holds them.
  An uninterrupted run averages at the same steps, so a resume from a
  periodic or epoch checkpoint is exact. A preemption save (SIGTERM)
  averages at the step it stops at: the resumed run equals a run that
  averaged there too.
- **Warm-up** (post-local SGD): for the first ``warmup_steps`` steps the
  weights are averaged after every step. With SGD (with or without
  momentum, Nesterov or not) that is synchronous training exactly (its
  update is linear in the gradient); with adaptive optimizers (Adam) the
  weights are synchronised each step but each replica keeps its own
  moment estimates.
- **Outer optimizer** (DiLoCo, Douillard et al. 2023): with
  ``outer_optimizer`` (e.g. ``keras.optimizers.SGD(0.7, momentum=0.9,
  nesterov=True)``) an averaging step does not take the average: the
  change since the last one, ``anchor - average``, is the outer gradient,
  the outer optimizer applies it to the anchor, and every replica starts
  from the new anchor. Its state is saved in checkpoints. During warm-up
  the plain average is taken (and becomes the anchor).

``every_steps=1`` with SGD equals synchronous training and one device.
Refused, with the reason: parameter servers and TPUs, gradient
accumulation, and ``Compression`` with it (no gradient all-reduce is left
to compress).

>>> import keras, numpy as np, tensorflow as tf, tfdist
>>> strategy = tfdist.make_strategy("mirrored", num_replicas=2)
>>> with strategy.scope():
...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
...     model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
>>> local = tfdist.communication.LocalSGD(every_steps=4)
>>> trainer = tfdist.Trainer(model, strategy, communication=local)
>>> x = np.random.RandomState(0).randn(64, 3).astype("float32")
>>> _ = trainer.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
>>> local.averagings   # steps 4 and 8 (the last also ends the epoch)
2
"""

import tensorflow as tf

from tfdist._internal import collectives, replica_share, sparse_gradients
from tfdist._internal.keras import optimizer as keras_optimizer, patches
from tfdist.communication.strategy_support import refuse_strategy
from tfdist.errors import ConfigurationError
from tfdist.replica import accumulation

_WRAPPED = "_tfdist_local_sgd"


class LocalSGD:
    """Weights averaged every ``every_steps`` steps (module doc).

    Args:
      every_steps: local steps between averagings (H >= 1).
      warmup_steps: first steps averaged after every step (post-local SGD).
      outer_optimizer: a Keras optimizer applied to ``anchor - average`` at
        each averaging (DiLoCo); None: the plain average.
    """

    def __init__(self, every_steps: int, warmup_steps: int = 0, outer_optimizer=None):
        if not isinstance(every_steps, int) or isinstance(every_steps, bool) or every_steps < 1:
            raise ConfigurationError(
                f"`every_steps` ({every_steps!r}) must be a positive integer: the local "
                "steps between two averagings of the weights (1: every step).")
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
            raise ConfigurationError(
                f"`warmup_steps` ({warmup_steps!r}) must be 0 or a positive integer: the "
                "first steps, averaged after every step.")
        if outer_optimizer is not None and not hasattr(outer_optimizer, "apply_gradients"):
            raise ConfigurationError(
                f"`outer_optimizer` ({outer_optimizer!r}) must be a Keras optimizer (e.g. "
                "keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)) or None.")
        self.every_steps, self.warmup_steps = every_steps, warmup_steps
        self.outer_optimizer = outer_optimizer
        self._strategy = self._optimizer = self._variables = self._averagings = None
        self._slots = []
        self._anchors, self._since = [], None  # made by `prepare`
        self._average_now = None

    def __repr__(self) -> str:
        return (f"LocalSGD(every_steps={self.every_steps}, warmup_steps={self.warmup_steps}, "
                f"outer_optimizer={self.outer_optimizer!r})")

    def attach_to(self, model, strategy: tf.distribute.Strategy) -> None:
        """Makes ``model``'s optimizer step locally (checking what cannot
        combine); `prepare` makes the averaging's state. Once per LocalSGD."""
        if self._strategy is not None:
            raise ConfigurationError(f"{self!r} is already attached to a model; make one "
                                     "LocalSGD per Trainer.")
        refuse_strategy(
            self, strategy,
            parameter_servers=("averages the weights of synchronous replicas; under "
                               "ParameterServerStrategy the weights live on the ps, one copy."),
            tpu=("is not available under TPUStrategy (not built: a TPU's replicas share one "
                 "program)."))
        optimizer = model.optimizer
        target = patches.inner_optimizer(optimizer)
        if accumulation.accumulation_steps(optimizer):
            raise ConfigurationError(
                f"communication={self!r} with gradient_accumulation_steps="
                f"{optimizer.gradient_accumulation_steps}: local steps apply each batch's "
                "gradients at once. Use one of the two.")
        self._strategy, self._optimizer = strategy, optimizer
        object.__setattr__(target, _WRAPPED, self)
        patches.replace_all_reduce_of(target, _local_gradients)

    def prepare(self, model) -> dict:
        """Once the model is built (under the strategy's scope): the
        averaging's variables. Returns `state`."""
        if self._since is not None:
            return self.state()
        self._variables = [getattr(v, "value", v) for v in model.trainable_variables]
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        optimizer = patches.inner_optimizer(self._optimizer)
        shared = (optimizer.iterations, keras_optimizer.learning_rate_variable(optimizer))
        self._slots = [getattr(v, "value", v) for v in optimizer.variables
                       if tf.as_dtype(v.dtype).is_floating and not any(v is s for s in shared)]
        self._since = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name="steps_since_averaging")
        self._averagings = tf.Variable(0, dtype=tf.int64, trainable=False, name="averagings")
        if self.outer_optimizer is not None:
            self._anchors = [tf.Variable(v.read_value(), trainable=False, name="anchor")
                             for v in self._variables]
            # A Keras optimizer belongs to the strategy it was made under: the
            # one given (usually made outside the scope) is made again here.
            given = self.outer_optimizer
            self.outer_optimizer = type(given).from_config(given.get_config())
            self.outer_optimizer.build(self._anchors)
        self._average_now = collectives.function(self._average_if_changed)
        return self.state()

    @property
    def averagings(self) -> int:
        """How many times the weights were averaged (0 before training)."""
        return 0 if self._averagings is None else int(self._averagings.numpy())

    def state(self) -> dict:
        """``{name: trackable}`` to checkpoint (the outer optimizer and anchors;
        the weights and optimizer are the model's, saved already)."""
        if self.outer_optimizer is None:
            return {}
        return {"outer_optimizer": self.outer_optimizer,
                "anchors": {f"anchor_{i}": a for i, a in enumerate(self._anchors)}}

    def after_step(self) -> None:
        """Cross-replica, after each step (in the training loop's function):
        averages when the schedule says so."""
        iterations = tf.cast(self._optimizer.iterations, tf.int64)
        self._since.assign_add(1)
        due = tf.logical_or(iterations <= self.warmup_steps,
                            (iterations - self.warmup_steps) % self.every_steps == 0)
        tf.cond(due, self._average, _nothing)

    def average_now(self) -> None:
        """Host side (epoch ends, before saves): averages unless nothing
        changed since the last averaging. Every worker calls it."""
        if self._average_now is not None:
            self._average_now()

    @tf.autograph.experimental.do_not_convert
    def _average_if_changed(self) -> None:
        tf.cond(self._since > 0, self._average, _nothing)

    def _average(self) -> None:
        """All-reduces the replicas' weights and sets every replica to the
        average (or to the outer optimizer's new anchor)."""
        strategy, averaged = self._strategy, self._variables + self._slots

        def replica_mean():
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.MEAN,
                                      [tf.identity(v) for v in averaged])

        means = [strategy.experimental_local_results(m)[0] for m in strategy.run(replica_mean)]
        for slot, mean in zip(self._slots, means[len(self._variables):]):
            slot.assign(mean)
        means = means[:len(self._variables)]
        if self._anchors:
            warm = tf.cast(self._optimizer.iterations, tf.int64) <= self.warmup_steps
            tf.cond(warm, lambda: self._set_anchors(means), lambda: self._outer_step(means))
            targets = [a.read_value() for a in self._anchors]
        else:
            targets = means
        for variable, target in zip(self._variables, targets):
            variable.assign(target)
        self._since.assign(0)
        self._averagings.assign_add(1)

    def _set_anchors(self, means) -> None:
        for anchor, mean in zip(self._anchors, means):
            anchor.assign(mean)

    def _outer_step(self, means) -> None:
        outer_gradients = [anchor.read_value() - mean for anchor, mean in zip(self._anchors, means)]
        self.outer_optimizer.apply_gradients(zip(outer_gradients, self._anchors))


def _nothing() -> None:
    """The branch of a condition that does nothing."""


def _local_gradients(optimizer, grads_and_vars):
    """In place of the optimizer's all-reduce: this replica's own gradient,
    scaled from the global example count to its share (times the replicas;
    a user's own step's loss carries that factor already:
    `tfdist._internal.replica_share`)."""
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync if context else 1
    scale = replicas * replica_share.gradient_scale()
    if scale == 1:
        return list(grads_and_vars)
    return [(sparse_gradients.scaled_gradient(g, scale), v) for g, v in grads_and_vars]


def attached_to(optimizer):
    """The `LocalSGD` attached to ``optimizer`` (or its inner one), or None."""
    return getattr(patches.inner_optimizer(optimizer), _WRAPPED, None)
