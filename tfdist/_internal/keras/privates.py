"""Every Keras private that tfdist reads by name, where each supported Keras
keeps it, and the check that runs when tfdist is imported.

Keras 3.16 moved the TensorFlow backend's op modules (``nn``, ``core``, ...)
from ``keras.src.backend.tensorflow`` into ``keras.src.backend.tensorflow.ops``
and stopped re-exporting the masking and autocast helpers from
``keras.src.backend``. The room's modules (`batch_statistics`,
`checkpoint_copies`, `patches`, ...) ask `tensorflow_ops` for a backend
module instead of spelling its path, so each Keras has one implementation
of that lookup, chosen once here from ``keras.__version__``.

`missing` lists every private (a module, a function, a class attribute)
that is not where tfdist reads it; ``tfdist._internal.keras`` raises
``tfdist.errors.UnsupportedKerasError`` naming all of them at import, so a
Keras that moved one fails before any model is touched, never with an
``AttributeError`` from inside a module. What lives on objects only (a
compiled model's loss container, a callback's file paths) is pinned by the
behaviour tests of ``tests/_internal/test_keras_contract.py``.

This module imports only the standard library, Keras and
`tfdist._internal.named_internals` (standard library only), so that the
contract test can read it on a Keras where tfdist's Keras room refuses to load.

>>> from tfdist._internal.keras import privates
>>> privates.tensorflow_ops("nn").__name__ in (
...     "keras.src.backend.tensorflow.nn", "keras.src.backend.tensorflow.ops.nn")
True
>>> privates.missing()
[]
"""

import dataclasses
import importlib
from typing import List, Optional, Tuple

import keras

from tfdist._internal import named_internals

__all__ = ["KERAS_LAYOUTS", "PRIVATES", "Private", "layout", "missing", "report",
           "tensorflow_ops"]

# Where each Keras minor keeps the TensorFlow backend's op modules. A Keras
# not listed here gets the newest layout whose package exists.
KERAS_LAYOUTS = {
    "3.15": "keras.src.backend.tensorflow",
    "3.16": "keras.src.backend.tensorflow.ops",
}


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _newest_first() -> List[str]:
    return sorted(KERAS_LAYOUTS, key=lambda minor: tuple(map(int, minor.split("."))),
                  reverse=True)


def _choose_layout() -> str:
    known = KERAS_LAYOUTS.get(_minor(keras.__version__))
    if known is not None:
        return known
    for minor in _newest_first():
        try:
            importlib.import_module(KERAS_LAYOUTS[minor] + ".nn")
            return KERAS_LAYOUTS[minor]
        except ImportError:
            continue
    return KERAS_LAYOUTS[_newest_first()[0]]  # (missing() then names what is not there)


_LAYOUT = _choose_layout()


def layout() -> str:
    """The package of the TensorFlow backend's op modules in this Keras."""
    return _LAYOUT


def tensorflow_ops(name: str):
    """The TensorFlow backend's op module ``name`` (``"nn"``, ``"core"``)
    where this Keras keeps it."""
    return importlib.import_module(f"{_LAYOUT}.{name}")


@dataclasses.dataclass(frozen=True)
class Private:
    """One Keras private tfdist reads: ``module`` (a path, or ``"{ops}"``
    for the TensorFlow backend's op package), then an attribute path in it
    (empty for the module itself); ``user`` is the room module that reads it."""

    module: str
    attribute: str
    user: str

    @property
    def name(self) -> str:
        module = self.module.replace("{ops}", _LAYOUT)
        return f"{module}.{self.attribute}" if self.attribute else module

    def find(self):
        """The object, or raises ImportError / AttributeError."""
        return named_internals.found(self.module.replace("{ops}", _LAYOUT), self.attribute)


_OPS, _OPTIMIZER = "{ops}", "keras.src.backend.tensorflow.optimizer"
_BASE_OPTIMIZER = "keras.src.optimizers.base_optimizer"

PRIVATES: Tuple[Private, ...] = (
    Private("keras.src.backend.common.masking", "get_keras_mask", "compiled"),
    Private("keras.src.backend.common.masking", "set_keras_mask", "compiled"),
    Private("keras.src.backend.common.variables", "get_autocast_scope", "compiled"),
    Private("keras.src.backend.common.variables", "AutocastScope", "compiled"),
    Private("keras.src.tree", "", "compiled"),
    Private("keras", "Model._flatten_metrics_in_order", "compiled"),
    Private(_OPS + ".nn", "_compute_moments", "batch_statistics"),
    Private(_OPS + ".nn", "_compute_moments_sync", "batch_statistics"),
    Private(_OPS + ".core", "Variable._copy_trackable_to_cpu", "checkpoint_copies"),
    Private(_OPS + ".core", "Variable.assign_add", "patches.wrap_variable_increments"),
    Private(_OPS + ".core", "Variable.assign_sub", "patches.wrap_variable_increments"),
    Private("keras.src.losses.loss", "scale_loss_for_distribution",
            "patches.wrap_loss_scaling"),
    Private("keras.src.losses.loss", "unscale_loss_for_distribution",
            "patches.wrap_loss_scaling"),
    Private(_OPTIMIZER, "TFOptimizer._all_reduce_sum_gradients", "patches.all_reduce_sum"),
    Private(_OPTIMIZER, "TFOptimizer._backend_update_step", "patches.replace_update_of"),
    Private(_OPTIMIZER, "TFOptimizer._apply_weight_decay", "patches.replace_weight_decay_of"),
    Private(_OPTIMIZER, "TFOptimizer._var_key", "optimizer.variable_key"),
    Private(_BASE_OPTIMIZER, "BaseOptimizer._clip_gradients", "patches.replace_clipping_of"),
    Private(_BASE_OPTIMIZER, "BaseOptimizer._check_variables_are_known",
            "optimizer.set_state_index"),
    Private(_BASE_OPTIMIZER, "BaseOptimizer._use_weight_decay", "optimizer.set_state_index"),
    Private(_BASE_OPTIMIZER, "BaseOptimizer._get_variable_index",
            "embedding_rows.update_touched_rows"),
    Private("keras.src.backend.tensorflow.random", "draw_seed", "patches.wrap_seed_draw"),
    Private("keras.src.backend.common.stateless_scope", "in_stateless_scope",
            "patches.wrap_variable_increments"),
    Private("keras.src.optimizers.loss_scale_optimizer", "LossScaleOptimizer.apply",
            "patches.wrap_loss_scale_apply"),
    Private("keras.src.trainers.data_adapters", "get_data_adapter", "data_adapters"),
    Private("keras.src.trainers.data_adapters.array_slicing", "train_validation_split",
            "data_adapters"),
    Private("keras.src.trainers.data_adapters.data_adapter_utils",
            "class_weight_to_sample_weights", "data_adapters"),
    Private("keras.src.trainers.data_adapters.tf_dataset_adapter",
            "make_class_weight_map_fn", "data_adapters"),
    Private("keras.src.utils.python_utils", "is_default", "callbacks"),
    Private("keras", "Layer._flatten_layers", "model_state.all_layers, layer_paths.children"),
    Private("keras", "Model._symbolic_build", "model_state.build_model_state"),
    Private("keras", "Variable._maybe_autocast", "sliced_weights"),
    Private(_OPS + ".core", "Variable._direct_assign", "sliced_weights"),
    Private(_OPS + ".core", "Variable._serialize_to_tensors", "sliced_weights"),
    Private(_OPS + ".core", "Variable._restore_from_tensors", "sliced_weights"),
)


def missing(privates=PRIVATES) -> List[Tuple[Private, str]]:
    """``[(private, why), ...]`` for each private not where tfdist reads it."""
    return named_internals.missing(privates)


def report(supported: Tuple[str, ...], gone: Optional[List[Tuple[Private, str]]] = None) -> str:
    """The message of the import error: this Keras, every private that moved
    or vanished (and which tfdist module reads it), the supported Keras."""
    gone = missing() if gone is None else gone
    lines = [f"tfdist cannot run on Keras {keras.__version__}: {len(gone)} of the Keras "
             f"internals tfdist reads moved or vanished (tfdist supports Keras "
             f"{', '.join(supported)}; docs/versions.md):"]
    lines += [f"  - {private.name} (read by tfdist._internal.keras.{private.user}): {why}"
              for private, why in gone]
    lines.append("Install a supported Keras (pip install 'keras==" + supported[-1] + ".*'), "
                 "or a tfdist release that supports this one.")
    return "\n".join(lines)

