"""What the ways of splitting a model do not combine with yet: the
refusals of `tfdist.parallel.plan.ModelPlan`, each a
`tfdist.errors.ConfigurationError` naming the combination and why, raised
when the split is attached (before any weight moves)."""

from typing import List, Optional

from tfdist.communication.fully_sharded import FullySharded
from tfdist.communication.plan import parts_of
from tfdist.errors import ConfigurationError
from tfdist.replica import keras_steps


def check_pipeline(pipeline, model, static_shapes: bool) -> None:
    """A pipeline alone: it cuts tfdist's step into micro-batches, so a
    model's own step (other than ``compute_loss``, which tfdist's step calls)
    and static shapes are refused."""
    own_steps = keras_steps.overridden(model)
    if [name for name in own_steps if name != "compute_loss"]:
        raise ConfigurationError(
            f"parallel={pipeline!r}: this model overrides {', '.join(own_steps)}; a "
            "pipeline runs tfdist's training step, which cuts each batch into "
            "micro-batches, and cannot cut a model's own step into them yet (a model "
            "that overrides only compute_loss can be). Drop the Pipeline for this model.")
    if static_shapes:
        raise ConfigurationError(
            f"parallel={pipeline!r} is not built for static shapes (TPUStrategy, "
            "static_shapes=True) yet: its micro-batches have the sizes the batch gives.")


def check_tensor_parallel(split, pipeline, model, communication,
                          static_shapes: bool) -> List[FullySharded]:
    """The model axis (``split``: the ``ModelParallel``, with ``pipeline``
    when there is one): returns the `FullySharded` parts of
    ``communication`` it composes with; refuses, naming each, a model's own
    step with a pipeline, other communication parts, FullySharded with a
    pipeline, and static shapes."""
    refused = []
    own_steps = [name for name in keras_steps.overridden(model) if name != "compute_loss"]
    if own_steps and pipeline is not None:
        refused.append(f"this model's own {', '.join(own_steps)} together with a "
                       "pipeline (a pipeline runs tfdist's training step, which cuts "
                       "each batch into micro-batches; a model that overrides only "
                       "compute_loss runs)")
    parts = parts_of(communication)
    sharded = [part for part in parts if isinstance(part, FullySharded)]
    if len(sharded) < len(parts):
        refused.append(f"communication={communication!r} (of the communication parts, "
                       "FullySharded() composes with the model axis)")
    if static_shapes:
        refused.append("static shapes (TPUStrategy, static_shapes=True)")
    if refused:
        raise ConfigurationError(
            f"parallel={split!r} does not combine with {'; '.join(refused)} yet. Drop "
            "one of them.")
    return sharded


def sharding_across_stages(pipeline, communication, replicas: int) -> Optional[FullySharded]:
    """The `FullySharded` part of ``communication`` (one, or None) that
    shards each stage's weights over the data axis, told to gather once per
    step; any other part is refused, naming it."""
    parts = parts_of(communication)
    others = [part for part in parts if not isinstance(part, FullySharded)]
    if others:
        raise ConfigurationError(
            f"parallel={pipeline!r} with communication={others[0]!r} is not built yet: a "
            "pipeline combines with FullySharded() (each stage's weights sharded over the "
            "replicas), not with other communication parts. Drop one of them.")
    if not parts or replicas == 1:
        return None  # (one replica: nothing to shard, FullySharded leaves Keras' update)
    parts[0]._gather_once_per_step()  # pylint: disable=protected-access
    return parts[0]
