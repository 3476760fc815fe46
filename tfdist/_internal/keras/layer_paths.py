"""A model's layers by path, and the units a way of splitting it runs.

A layer's path is the names from the model down to it, joined by ``/``:
``"backbone/block_2"`` is layer ``block_2`` inside layer ``backbone``
(a functional model used as a layer, a ``Sequential``, or a layer of
one's own that holds its sublayers as attributes), as
``model.get_layer("backbone").get_layer("block_2")`` finds it. (Keras'
own ``variable.path`` depends on where each layer was built, so two models
that are the same tree can give their weights different paths; a layer's
path here does not.)

`units` turns the layers a way of splitting names (a pipeline's cuts,
fully sharded units) into the layers it runs as units: every layer named,
and beside them the other layers of every layer it had to open to reach
them, so that each weight of the model belongs to exactly one unit:

>>> import keras
>>> inputs = keras.Input((4,))
>>> x = keras.layers.Dense(4, name="block_0")(inputs)
>>> x = keras.layers.Dense(4, name="block_1")(x)
>>> backbone = keras.Model(inputs, x, name="backbone")
>>> model = keras.Sequential([keras.Input((4,)), backbone, keras.layers.Dense(1, name="head")])
>>> [unit.path for unit in units(model, ["backbone/block_0"])]
['backbone/block_0', 'backbone/block_1', 'head']
>>> [unit.path for unit in units(model, [])]
['backbone', 'head']
"""

import dataclasses
import re
from typing import Iterator, List, Sequence, Tuple

import keras

from tfdist.errors import ConfigurationError


@dataclasses.dataclass(frozen=True)
class Unit:
    """One layer a way of splitting runs as a whole, and its path."""

    path: str
    layer: object


def children(layer) -> list:
    """``layer``'s own sublayers, in order: a model's ``layers`` (a
    functional model's in the order its graph runs them), otherwise the
    layers it tracks as attributes, in the order they were set."""
    if isinstance(layer, keras.Model):
        return [child for child in layer.layers if not isinstance(child, keras.layers.InputLayer)]
    return list(layer._flatten_layers(include_self=False, recursive=False))  # pylint: disable=protected-access


def walk(model) -> Iterator[Tuple[str, object]]:
    """Every layer inside ``model`` as (path, layer), each before its
    sublayers, in order."""
    def visit(layer, prefix):
        for child in children(layer):
            path = prefix + child.name
            yield path, child
            yield from visit(child, path + "/")
    yield from visit(model, "")


def units(model, named: Sequence[str], *, what: str = "units") -> List[Unit]:
    """The layers of ``model`` a way of splitting runs as units: each layer
    at a path in ``named``, and every other layer of each layer opened to
    reach them (module doc), in the model's order. ``what`` names the
    argument in errors.

    Refused, naming the paths: a path no layer has, two layers at one path,
    a named layer inside another named one, and an opened layer that owns
    weights of its own besides its sublayers' (they would belong to no
    unit)."""
    paths = {}
    for path, layer in walk(model):
        paths.setdefault(path, []).append(layer)
    for path in named:
        if path not in paths:
            raise ConfigurationError(
                f"{what}: no layer at path {path!r}; the model's layers are "
                f"{_listed(list(paths))} (a nested layer by its path: 'outer/inner').")
        if len(paths[path]) > 1:
            raise ConfigurationError(
                f"{what}: {len(paths[path])} layers have the path {path!r}; give them "
                "different names.")
    opened = {path.rsplit("/", 1)[0] for path in named if "/" in path}
    opened |= {prefix for path in opened for prefix in _ancestors(path)}
    inside = sorted(set(named) & opened)
    if inside:
        raise ConfigurationError(
            f"{what}: {inside} name(s) a layer that holds another named layer; name the "
            "outer layer or the inner ones, not both.")

    def visit(layer, prefix):
        for child in children(layer):
            path = prefix + child.name
            if path not in opened:
                yield Unit(path, child)
                continue
            own = _own_weights(child)
            if own:
                raise ConfigurationError(
                    f"{what}: layer {path!r} is opened to reach {sorted(p for p in named if p.startswith(path + '/'))}, "
                    f"but it owns weights of its own besides its sublayers' "
                    f"({[w.name for w in own]}), which would belong to no unit. Name "
                    f"{path!r} itself.")
            yield from visit(child, path + "/")
    return list(visit(model, ""))


def matching(model, patterns: Sequence[str]) -> List[str]:
    """The paths of ``model``'s layers that one of ``patterns`` (regular
    expressions, as `keras.distribution.LayoutMap` keys are) matches whole,
    outermost first: a layer inside a matched one is not listed."""
    compiled = [re.compile(pattern) for pattern in patterns]
    found = []
    for path, _ in walk(model):
        if any(path.startswith(outer + "/") for outer in found):
            continue
        if any(pattern.fullmatch(path) for pattern in compiled):
            found.append(path)
    return found


def _ancestors(path: str) -> List[str]:
    parts = path.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def _own_weights(layer) -> list:
    held = {id(w) for child in children(layer) for w in child.weights}
    return [w for w in layer.weights if id(w) not in held]


def _listed(paths: List[str], limit: int = 24) -> str:
    shown = ", ".join(repr(p) for p in paths[:limit])
    return f"[{shown}{', ...' if len(paths) > limit else ''}]"
