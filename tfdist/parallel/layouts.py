"""Keras' layout API read for tensor parallelism: what a
``keras.distribution.ModelParallel`` asks of each weight of a built model,
checked before anything runs (`ModelLayout.of`).

A Keras-on-JAX user writes the layout once::

    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")     # column: output features split
    layout_map["d2/kernel"] = ("model", None)     # row: input features split
    distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                    batch_dim_name="batch")

Keras matches each rule against ``variable.path`` as `LayoutMap` does (an
exact key, else a regular expression matched whole), and a weight no rule
matches is replicated. This module reads the same rules into one record
per sharded weight: which dimension the mesh's model axis splits, and the
Megatron-LM form that gives the layer (`FORMS`):

- ``Dense`` / ``EinsumDense``: ``"column"`` when the split dimension is
  one of the output's (no communication in the forward pass; the bias is
  split with it), ``"row"`` when it is contracted (partial products summed
  across the model axis; the bias whole);
- ``MultiHeadAttention``: its query, key and value projections by heads
  (their kernels' heads dimension: column) and its output projection by
  heads (row), as Keras' own ``EinsumDense`` sublayers;
- ``Embedding``: ``"vocabulary"`` (rows: each device looks up the ids in
  its range) or ``"embedding_columns"``.

A layout it cannot honour is a `tfdist.errors.ConfigurationError` naming
the weight and the rule: a weight two rules match, a split that does not divide the
dimension, two dimensions on the model axis, a sharded weight of a layer
without a sharded form, a bias split without its kernel, a weight split
over the data axis (fully sharded weights are
``communication=FullySharded()``) or the pipeline axis (a ``Pipeline``
places layers whole by its cuts), a mesh other than data x model or
data x pipeline x model (its third axis named ``"pipeline"``). A rule
that matches no weight and no layer output changes nothing, as in Keras,
and is named in a warning (keras.io's distribution guide has one: a bias
rule for a layer without a bias).

>>> import keras
>>> inputs = keras.Input((6,))
>>> hidden = keras.layers.Dense(8, activation="relu", name="d1")(inputs)
>>> model = keras.Model(inputs, keras.layers.Dense(4, name="d2")(hidden))
>>> mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
>>> layout_map = keras.distribution.LayoutMap(mesh)
>>> layout_map["d1/kernel"] = (None, "model")
>>> layout_map["d2/kernel"] = ("model", None)
>>> layout_map[".*bias"] = ("model",)
>>> layout = ModelLayout.of(keras.distribution.ModelParallel(
...     layout_map=layout_map, batch_dim_name="batch"), model)
Traceback (most recent call last):
...
tfdist.errors.ConfigurationError: weight 'd2/bias' (rule '.*bias') splits a bias over the model axis, but its layer's kernel is split by rows: a bias is split with a kernel split by columns, else kept whole. Drop the rule.
>>> del layout_map[".*bias"]
>>> layout_map["d1/bias"] = ("model",)
>>> layout = ModelLayout.of(keras.distribution.ModelParallel(
...     layout_map=layout_map, batch_dim_name="batch"), model)
>>> layout.axes
{'data': 1, 'pipeline': 1, 'model': 2}
>>> [(w.path, w.form, w.dimension) for w in layout.sharded]
[('d1/kernel', 'column', 1), ('d1/bias', 'column', 0), ('d2/kernel', 'row', 0)]
"""

import dataclasses
import re
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np

from tfdist._internal.keras import distributions as keras_distributions, layer_paths
from tfdist.errors import ConfigurationError
from tfdist.parallel.sharded_layers import KernelForm

# The mesh axis a Pipeline's stages run along (data x pipeline x model), as
# `tfdist.parallel.plan` names it.
PIPELINE_AXIS = "pipeline"

# The layer types with a sharded form, and the forms a split gives them.
FORMS = {
    "Dense": ("column", "row"),
    "EinsumDense": ("column", "row"),
    "Embedding": ("vocabulary", "embedding_columns"),
}


@dataclasses.dataclass(frozen=True)
class ShardedWeight:
    """One weight the model axis splits.

    Attributes:
      path: the weight's ``variable.path`` (what the rule matched).
      rule: the `LayoutMap` key that matched it.
      layer_path: its layer's path in the model
        (`tfdist._internal.keras.layer_paths`).
      layer_type: the layer's class name (a key of `FORMS`).
      form: the Megatron-LM form the split gives the layer (module doc).
      dimension: the weight's dimension split over the model axis.
    """

    path: str
    rule: str
    layer_path: str
    layer_type: str
    form: str
    dimension: int


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    """What a ``ModelParallel`` distribution asks of one built model.

    Attributes:
      data_axis, model_axis: the mesh's axis names (the batch's, the one
        weights are split over).
      axes: each axis' size, under tfdist's names (``data``, ``pipeline``,
        ``model``; ``pipeline`` 1 on a mesh without that axis).
      devices: the mesh's devices, one row per data-axis index: its model
        devices, or with a pipeline axis stage 0's, then stage 1's, ... (`stages_of`).
      sharded: each weight the model axis splits, in the model's order.
      outputs: each ``"<layer path>/output"`` rule that matched a layer, as
        (layer path, axes).
    """

    data_axis: str
    model_axis: str
    axes: Dict[str, int]
    devices: Tuple[Tuple[str, ...], ...]
    sharded: Tuple[ShardedWeight, ...]
    outputs: Tuple[Tuple[str, tuple], ...]

    def stages_of(self, row: Sequence[str]) -> List[List[str]]:
        """One row of `devices` (a replica's) as its stages' model
        devices: one list per pipeline-axis index."""
        model = self.axes["model"]
        return [list(row[start:start + model]) for start in range(0, len(row), model)]

    @staticmethod
    def check_distribution(distribution) -> None:
        """Refuses what is not a ``keras.distribution.ModelParallel``."""
        if not isinstance(distribution, keras.distribution.ModelParallel):
            raise ConfigurationError(
                f"a layout is a keras.distribution.ModelParallel; got {distribution!r}.")

    @classmethod
    def of(cls, distribution, model) -> "ModelLayout":
        """Reads ``distribution`` (a ``keras.distribution.ModelParallel``)
        for ``model`` (built), checking every rule (module doc)."""
        cls.check_distribution(distribution)
        mesh = distribution.device_mesh
        names, shape = list(mesh.axis_names), tuple(mesh.shape)
        data_axis = distribution.batch_dim_name
        pipeline_axis = PIPELINE_AXIS if PIPELINE_AXIS in names and data_axis != PIPELINE_AXIS \
            else None
        others = [name for name in names if name not in (data_axis, pipeline_axis)]
        if data_axis not in names or len(others) != 1:
            raise ConfigurationError(
                f"tensor parallelism takes a mesh of two axes, the batch's ({data_axis!r}) and "
                f"the model's, or three with a pipeline's named {PIPELINE_AXIS!r} (its stages' "
                f"devices); this one has axes {names} of sizes {list(shape)}.")
        model_axis = others[0]
        order = [names.index(data_axis)] + ([names.index(pipeline_axis)] if pipeline_axis
                                            else []) + [names.index(model_axis)]
        grid = np.transpose(np.asarray(mesh.devices), order)
        axes = {"data": grid.shape[0], "pipeline": grid.shape[1] if pipeline_axis else 1,
                "model": grid.shape[-1]}
        devices = grid.reshape(grid.shape[0], -1)  # (a data index' row: stage after stage)
        rules = dict(_rules(distribution))
        matched = set()
        sharded = []
        owners = _owners(model)
        for variable in model.weights:
            rule = _rule_for(variable.path, rules, what=f"weight {variable.path!r}")
            if rule is None:
                continue
            matched.add(rule)
            weight = _sharded(variable, rule, rules[rule], owners.get(id(variable)),
                              data_axis, model_axis, axes, pipeline_axis)
            if weight is not None:
                sharded.append(weight)
        _check_biases(sharded)
        outputs = []
        for path, _ in layer_paths.walk(model):
            rule = _rule_for(path + "/output", rules, what=f"layer output {path + '/output'!r}")
            if rule is not None:
                matched.add(rule)
                outputs.append((path, rules[rule]))
        unmatched = [rule for rule in rules if rule not in matched]
        if unmatched:  # (Keras ignores them too; most likely a typo: said, not raised)
            warnings.warn(
                f"layout rule(s) {unmatched} match no weight and no layer output of this model "
                f"and change nothing; its weights' paths are "
                f"{_listed([v.path for v in model.weights])} (print `variable.path` for each "
                "of `model.weights` to write a rule).", stacklevel=3)
        return cls(data_axis, model_axis, axes,
                   tuple(tuple(str(d) for d in row) for row in devices.tolist()),
                   tuple(sharded), tuple(outputs))


def _rules(distribution) -> List[Tuple[str, tuple]]:
    layout_map = keras_distributions.layout_map_of(distribution)
    return [(key, tuple(layout_map[key].axes)) for key in layout_map]


def _rule_for(path: str, rules: Dict[str, tuple], *, what: str) -> Optional[str]:
    """The rule Keras' LayoutMap gives ``path``: its own key, else the one
    regular expression that matches it whole; two is an error."""
    if path in rules:
        return path
    found = [key for key in rules if re.fullmatch(key, path)]
    if len(found) > 1:
        raise ConfigurationError(
            f"{what} is matched by {len(found)} layout rules: {found} (Keras' LayoutMap "
            "takes one rule per weight). Make the rules match it once.")
    return found[0] if found else None


def _owners(model) -> Dict[int, Tuple[str, object]]:
    """Each weight's layer, as (path, layer): the innermost layer holding it."""
    owners = {}
    for path, layer in layer_paths.walk(model):
        for weight in layer.weights:
            owners[id(weight)] = (path, layer)  # (inner layers come later: they win)
    return owners


def _sharded(variable, rule, axes, owner, data_axis, model_axis, sizes,
             pipeline_axis=None) -> Optional[ShardedWeight]:
    where = f"weight {variable.path!r} (rule {rule!r}: {axes})"
    if pipeline_axis is not None and pipeline_axis in axes:
        raise ConfigurationError(
            f"{where} splits a dimension over the pipeline axis {pipeline_axis!r}: a "
            "Pipeline places each layer's weights whole on its stage's devices (by its "
            "cuts); give the rule None there.")
    if len(axes) != len(variable.shape):
        raise ConfigurationError(
            f"{where}: the rule names {len(axes)} dimensions; the weight has "
            f"{len(variable.shape)} ({tuple(variable.shape)}).")
    if data_axis in axes and sizes["data"] > 1:
        raise ConfigurationError(
            f"{where} splits a dimension over the data axis {data_axis!r}: weights sharded "
            "over the data axis are communication=tfdist.communication.FullySharded() (an "
            "Embedding table's rows too, looked up where they live; not built together with "
            "the model axis yet); give the rule None there.")
    split = [index for index, axis in enumerate(axes) if axis == model_axis]
    if not split:
        return None  # (replicated, as Keras replicates a weight without a rule)
    if len(split) > 1:
        raise ConfigurationError(f"{where} splits {len(split)} dimensions over the model axis "
                                 f"{model_axis!r}; split one.")
    dimension = split[0]
    if variable.shape[dimension] % sizes["model"]:
        raise ConfigurationError(
            f"{where}: dimension {dimension} ({variable.shape[dimension]}) does not divide "
            f"over the model axis' {sizes['model']} devices.")
    layer_path, layer = owner if owner is not None else ("?", None)
    layer_type = type(layer).__name__
    if layer_type not in FORMS:
        raise ConfigurationError(
            f"{where}: its layer {layer_path!r} is a {layer_type}, which has no sharded form "
            f"(sharded forms: {', '.join(sorted(FORMS))}); drop the rule to replicate it.")
    return ShardedWeight(variable.path, rule, layer_path, layer_type,
                         _form(layer, variable, dimension, where), dimension)


def _form(layer, variable, dimension: int, where: str) -> str:
    if isinstance(layer, keras.layers.Embedding):
        return "vocabulary" if dimension == 0 else "embedding_columns"
    kernel = layer.kernel
    if variable is not kernel and variable.path != kernel.path:
        return "column"  # a bias: split as its kernel's outputs are (`_check_biases`)
    return KernelForm.of(layer, dimension, where=where).form


def _check_biases(sharded: List[ShardedWeight]) -> None:
    """A bias split over the model axis needs its kernel split by columns
    (each device adds its part of the bias to its outputs); a row form's
    bias is added once, whole."""
    kernels = {w.layer_path: w for w in sharded if w.path.endswith("kernel")}
    for weight in sharded:
        if weight.path.endswith("kernel") or weight.form not in ("column", "row"):
            continue
        kernel = kernels.get(weight.layer_path)
        if kernel is None or kernel.form != "column":
            raise ConfigurationError(
                f"weight {weight.path!r} (rule {weight.rule!r}) splits a bias over the model "
                f"axis, but its layer's kernel is {'not split' if kernel is None else 'split by rows'}: "
                "a bias is split with a kernel split by columns, else kept whole. Drop the rule.")


def _listed(paths: List[str], limit: int = 12) -> str:
    shown = ", ".join(repr(p) for p in paths[:limit])
    return f"[{shown}{', ...' if len(paths) > limit else ''}]"
