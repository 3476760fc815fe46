"""The user's Keras optimizer made for a tensor-parallel model's shards
(`tfdist.parallel.tensor_parallel`).

Keras builds an optimizer's state from the weights it is given and
updates them one by one; a split weight is kept as k shards, so the
optimizer is given the shards instead (its state, Adam's moments, made
shard by shard beside each), and what it saves is an unsplit optimizer's
state (`tfdist.parallel.split_state`). `build_for_shards` changes one
optimizer instance (its ``build``, ``apply`` and
``finalize_variable_values``), as the other ways of splitting do
(`tfdist._internal.keras.patches`):

- ``build``: the model's weights given, each split weight replaced by its
  shards (AdamW's ``exclude_from_weight_decay`` decided by the weight's
  name, for its shards too); with fully sharded weights over the data axis
  (`tfdist.communication.FullySharded`), the state of the shards' slices,
  which that part builds, saved whole through each shard's whole state;
- ``apply``: ``clipnorm`` clips a split weight's gradient by the whole
  weight's norm (`tfdist._internal.keras.norm_groups`);
- ``finalize_variable_values`` (``use_ema``): the shards' averages;
- gradient accumulation (`tfdist.replica.accumulation`) keeps a sum beside
  each shard and saves one whole sum per weight.
"""

import dataclasses
from typing import Callable

from tfdist._internal.keras import norm_groups, optimizer as keras_optimizer, patches
from tfdist.communication import sharded_checkpoints
from tfdist.parallel import split_state
from tfdist.replica import accumulation


@dataclasses.dataclass(frozen=True)
class SplitWeights:
    """How to read which weights are split (`tfdist.parallel.tensor_parallel`).

    Attributes:
      shards_of: a weight's shards, or None when it is whole.
      flat: a list of weights with each split one replaced by its shards.
      dimension_of: the dimension a split weight's shards divide.
    """

    shards_of: Callable
    flat: Callable
    dimension_of: Callable


def build_for_shards(optimizer, split: SplitWeights, keys_before: dict, strategy,
                     weights: Callable, sharding=None) -> None:
    """Makes ``optimizer`` (unbuilt) build, apply and finalize for the
    shards (module doc). ``keys_before``: each weight's optimizer key
    before it was split (by ``id``), for weight decay's exclusions by
    name; ``weights()``: the model's trainable weights; ``sharding``: a
    `tfdist.communication.FullySharded` slicing the shards over the data
    axis, or None."""
    keras_build = optimizer.build

    def build(variables):
        for variable in variables:
            if split.shards_of(variable):
                keras_optimizer.exclude_from_decay_like(
                    optimizer, split.shards_of(variable),
                    (keys_before.get(id(variable)),
                     keras_optimizer.variable_key(optimizer, variable)))
        flat = split.flat(variables)
        below = None
        if sharding is None:
            record = sharded_checkpoints.BuildRecord()
            with record.recording(optimizer, flat):
                keras_build(flat)
        else:  # pylint: disable=protected-access
            sharding._build_state(optimizer, keras_build, flat, strategy)
            record = sharding._ordinary_state_record()
            below = lambda: sharding._ordinary_variables(optimizer)  # noqa: E731
        shards = [(index, part, split.dimension_of(variable))
                  for index, variable in enumerate(variables)
                  for part in range(len(split.shards_of(variable) or [variable]))]
        split_state.save_whole(optimizer, split_state.OrdinaryState(record, shards, variables),
                               below)

    keras_finalize = optimizer.finalize_variable_values

    def finalize_variable_values(variables):  # (use_ema: the averages are the shards')
        keras_finalize(split.flat(variables))

    keras_apply = optimizer.apply

    def apply(grads, trainable_variables=None):  # (clipnorm: which shards are one weight)
        grads = list(grads)
        if trainable_variables is None:
            return keras_apply(grads, trainable_variables)
        with norm_groups.clipping(grads, list(trainable_variables)):
            return keras_apply(grads, trainable_variables)

    patches.replace_methods_of(optimizer, {"build": build, "apply": apply,
                                           "finalize_variable_values": finalize_variable_values})
    accumulation.sums_saved_as(optimizer, lambda parts: split_state.joined_by_weight(
        parts, weights(), split.shards_of, split.dimension_of))
