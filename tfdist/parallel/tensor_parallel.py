"""Tensor parallelism from Keras' own layout API: each weight a
``keras.distribution.LayoutMap`` rule splits over the mesh's model axis
kept as shards on the model devices of every replica, and its layer run
in the matching Megatron-LM form (`tfdist.parallel.sharded_layers`).

What a model attached with ``parallel=ModelParallel(...)`` becomes:

- **Devices**: the mesh's row r (its data-axis index r) lists replica r's
  model devices, shard j of every split weight on the row's device j.
  The data axis is the strategy's replicas (MirroredStrategy in one
  process, MultiWorkerMirroredStrategy over workers, each worker running
  its own rows), so the mesh has as many rows as the strategy has
  replicas (one without a strategy): `tfdist.parallel.mesh_rows`.
- **Storage**: each split weight is k shard variables (Keras variables,
  mirrored over the data axis: replica r's copy on its row's device j);
  a column-split layer's bias is split with its kernel. The layer's own
  Keras variable is kept as a view (`tfdist._internal.keras.sliced_weights`):
  ``get_weights``, ``model.save``, checkpoints and callbacks read it
  whole, joined from the shards, and writing it whole writes the shards.
  Inside a step nothing reads it whole: its layer reads its shards, and
  any other read is an error naming the weight (it would gather it).
- **Gradients and updates**: the step differentiates with respect to
  the shards (`trainable_variables`), and the user's Keras optimizer is
  built for them: its state (Adam's moments) is made shard by shard
  beside each, and each shard is updated on its device. An elementwise
  optimizer therefore computes one device's numbers; clipping too: a
  global norm is summed over the shards, and ``clipnorm`` takes each split
  weight's norm from its shards' (`tfdist._internal.keras.norm_groups`). The optimizer
  saves its state whole, as an unsplit one (`tfdist.parallel.split_state`;
  the optimizer made for the shards: `tfdist.parallel.split_optimizer`).

Layers with split forms: ``Dense`` and ``EinsumDense`` by columns or rows
(`tfdist.parallel.sharded_layers`), ``MultiHeadAttention`` by heads (its
projections' rules; `tfdist.parallel.sharded_attention`), ``Embedding``
by vocabulary rows or by columns (`tfdist.parallel.sharded_embeddings`).
Output rules that put the model axis on a sequence dimension split the
layers between them by sequence (`tfdist.parallel.sharded_sequence`).

A split weight's ``L1``, ``L2`` or ``L1L2`` regularizer is the sum of its
shards' terms, each on its shard's device (`tfdist.parallel.split_regularizers`).

A model's own ``train_step`` / ``test_step`` runs as written: while
tfdist traces it, its layers list each split weight's shards as trainable
(`tfdist._internal.keras.step_weights`), so ``tape.gradient(loss,
self.trainable_variables)`` and ``self.optimizer.apply`` reach the shards;
reading a split weight whole in it is an error naming the weight.

Not built yet, refused with an error saying so: other split layers,
other regularizers and constraints on split weights, LoRA and quantized layers,
a model's own step together with a pipeline, communication parts other than
``FullySharded()``. With a pipeline, and with fully sharded weights (each
shard sliced over the data axis), it composes: `tfdist.parallel.plan`.

>>> import keras, numpy as np, tfdist
>>> devices = tfdist.strategies.configure_logical_cpus(2)
>>> inputs = keras.Input((6,))
>>> hidden = keras.layers.Dense(8, activation="relu", name="d1")(inputs)
>>> model = keras.Model(inputs, keras.layers.Dense(4, name="d2")(hidden))
>>> model.compile(optimizer="adam", loss="mse")
>>> mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
>>> layout_map = keras.distribution.LayoutMap(mesh)
>>> layout_map["d1/kernel"] = (None, "model")
>>> layout_map["d2/kernel"] = ("model", None)
>>> _ = tfdist.attach(model, parallel=keras.distribution.ModelParallel(
...     layout_map=layout_map, batch_dim_name="batch"))
>>> _ = model.fit(np.ones((8, 6), "float32"), np.ones((8, 4), "float32"), verbose=0)
>>> [w.shape for w in model.get_weights()]           # read whole
[(6, 8), (8,), (8, 4), (4,)]
>>> [tuple(v.shape) for v in tfdist.parallel.tensor_parallel.shards_of(model.layers[1].kernel)]
[(6, 4), (6, 4)]
"""

import collections
import contextlib
import warnings
from typing import Callable, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from tfdist._internal.keras import layer_paths, layer_units, model_state as keras_model_state
from tfdist._internal.keras import distributions as keras_distributions
from tfdist._internal.keras import optimizer as keras_optimizer, patches
from tfdist._internal.keras import norm_groups, placed_weights, sliced_weights
from tfdist._internal.tensorflow import distributed_variables
from tfdist.errors import ConfigurationError
from tfdist.parallel import mesh_rows, sharded_attention, split_regularizers, split_state
from tfdist.parallel import layouts, sharded_sequence, split_optimizer, stage_updates
from tfdist.parallel.layouts import ModelLayout
from tfdist.parallel.sharded_embeddings import EmbeddingShards
from tfdist.parallel.sharded_layers import KernelForm, KernelShards, SplitActivations

_SHARDS = "_tfdist_model_shards"  # on a split Keras variable: its shards
_DIMENSION = "_tfdist_split_dimension"  # ... and the dimension they split


def shards_of(variable) -> Optional[List[keras.Variable]]:
    """The shards a split weight is kept in (module doc), or None."""
    return getattr(variable, _SHARDS, None)


class TensorParallel:
    """A model split by a ``keras.distribution.ModelParallel`` (module
    doc); `tfdist.parallel.plan.ModelPlan` attaches it once the model is
    built."""

    def __init__(self, distribution):
        ModelLayout.check_distribution(distribution)
        self.distribution = distribution
        self.layout: Optional[ModelLayout] = None
        # each local replica's stages' first model devices (`attach`)
        self.stage_devices: Optional[List[List[str]]] = None
        self._activations = SplitActivations()

    def __repr__(self) -> str:
        mesh = self.distribution.device_mesh
        return (f"ModelParallel(mesh={dict(zip(mesh.axis_names, mesh.shape))}, "
                f"batch_dim_name={self.distribution.batch_dim_name!r})")

    @property
    def model_devices(self) -> int:
        """The mesh's model axis' size (1 for a mesh without one)."""
        mesh = self.distribution.device_mesh
        names = list(mesh.axis_names)
        others = [index for index, name in enumerate(names)
                  if name not in (self.distribution.batch_dim_name, layouts.PIPELINE_AXIS)]
        return int(mesh.shape[others[0]]) if len(others) == 1 else 1

    # -- set-up ------------------------------------------------------------

    def attach(self, model, strategy: Optional[tf.distribute.Strategy],
               stage_of: Optional[Callable[[str], int]] = None, pipeline=None,
               sharding=None) -> None:
        """Splits ``model``'s weights as the layout says (module doc).

        With ``pipeline`` (a `tfdist.parallel.Pipeline`, on a mesh whose
        ``"pipeline"`` axis has one index per pipeline device) and
        ``stage_of`` (a layer's stage, by path): each layer's shards go on
        its stage's model devices, and ``stage_devices`` lists each
        replica's stages' first model devices, where the pipeline runs the
        stages (`tfdist.parallel.plan`).

        With ``sharding`` (a `tfdist.communication.FullySharded` over the
        data axis, which slices the shards once this returns): the
        optimizer's state is the shards' slices' (its ``_build_state``), saved
        whole by weight through each shard's whole state."""
        if self.layout is not None:
            return
        layout = ModelLayout.of(self.distribution, model)
        sequence_rules = _sequence_rules(layout, self)
        wanted = 1 if pipeline is None else pipeline.devices_per_pipeline
        if layout.axes["pipeline"] != wanted:
            raise ConfigurationError(
                f"parallel={self!r}: " + (
                    f"the mesh has a {layouts.PIPELINE_AXIS!r} axis; give the Pipeline whose "
                    "stages it places with it: parallel=[tfdist.parallel.Pipeline(cuts=...), "
                    "ModelParallel(...)]." if pipeline is None else
                    f"{pipeline!r} runs on {wanted} devices per pipeline; the mesh needs a "
                    f"{layouts.PIPELINE_AXIS!r} axis of that size (data x pipeline x model, "
                    f"{[layout.axes['data'], wanted, layout.axes['model']]}); it has "
                    f"{layout.axes['pipeline']}."))
        stages = [layout.stages_of(row) for row in _model_devices(layout, strategy, self)]
        self.stage_devices = [[devices[0] for devices in row] for row in stages]
        optimizer = patches.inner_optimizer(model.optimizer)
        if optimizer.built:
            raise ConfigurationError(
                f"parallel={self!r} must be attached before the optimizer is built (it "
                "builds the optimizer's state shard by shard). Attach before the first fit.")
        layers = dict(layer_paths.walk(model))
        by_layer = collections.OrderedDict()
        for weight in layout.sharded:
            by_layer.setdefault(weight.layer_path, []).append(weight)
        keys_before = {id(w): keras_optimizer.variable_key(optimizer, w) for w in model.weights}
        split = {}
        for path, weights in by_layer.items():
            stage = 0 if stage_of is None else stage_of(path)
            per_replica = [row[stage % len(row)] for row in stages]
            split[id(layers[path])] = self._split_layer(layers[path], path, weights,
                                                        per_replica, strategy)
        self._split_attentions(model, split)
        sharded_sequence.apply_rules(
            sequence_rules, layers, split, self._activations, sharded_sequence.devices_by_first(
                [devices for row in stages for devices in row], mesh_rows.canonical), self)
        split_optimizer.build_for_shards(
            optimizer, split_optimizer.SplitWeights(shards_of, trainable_variables, _dimension_of),
            keys_before, strategy, lambda: model.trainable_variables, sharding)
        stage_updates.run_on_weight_devices(model.optimizer)
        self.layout = layout

    def _split_layer(self, layer, path, weights, per_replica, strategy):
        """``layer``'s split weights made shards and its call their form;
        returns its shards' record."""
        _check_layer(self, layer, path, weights)
        where = f"parallel={self!r}: layer {path!r}"
        if isinstance(layer, keras.layers.Embedding):
            tables = _split(layer.embeddings, weights[0].dimension, per_replica, strategy)
            shards = EmbeddingShards(weights[0].form, tables, layer.input_dim, self._activations)
            layer_units.wrap_call(layer, "shard", lambda original: (
                lambda inputs: shards.call(layer, inputs)))
            return shards
        kernel = next(w for w in weights if w.path.endswith("kernel"))
        form = KernelForm.of(layer, kernel.dimension, where=where)
        kernels = _split(layer.kernel, kernel.dimension, per_replica, strategy)
        biases = None
        if getattr(layer, "bias", None) is not None and form.form == "column":
            for weight in weights:
                if weight is not kernel and weight.dimension != form.bias_dimension:
                    raise ConfigurationError(
                        f"{where}: rule {weight.rule!r} splits the bias' dimension "
                        f"{weight.dimension}; the kernel's split divides its dimension "
                        f"{form.bias_dimension}. Make them agree, or drop the bias rule (a "
                        "column split splits the bias with it).")
            biases = _split(layer.bias, form.bias_dimension, per_replica, strategy)
        elif getattr(layer, "bias", None) is not None:  # (row: added once, on the first device)
            placed_weights.place_copies(layer.bias, [row[0] for row in per_replica], strategy)
            biases = [layer.bias]
        shards = KernelShards(form, kernels, biases, self._activations)
        layer_units.wrap_call(layer, "shard", lambda original: (
            lambda inputs, training=None: shards.call(layer, inputs, training)))
        return shards

    def _split_attentions(self, model, split: Dict[int, object]) -> None:
        """Each ``MultiHeadAttention`` whose query, key and value are split
        by columns alike runs its attention by heads (`tfdist.parallel.sharded_attention`)."""
        for _, layer in layer_paths.walk(model):
            if not isinstance(layer, keras.layers.MultiHeadAttention):
                continue
            projections = [split.get(id(p)) for p in (layer.query_dense, layer.key_dense,
                                                      layer.value_dense)]
            if all(isinstance(p, KernelShards) and p.form.form == "column"
                   and p.form.axis == projections[0].form.axis
                   and len(p.kernels) == len(projections[0].kernels) for p in projections):
                sharded_attention.split_by_heads(layer, projections, self._activations)


def _dimension_of(variable) -> Optional[int]:
    """The dimension a split weight's shards divide (None: not split)."""
    return getattr(variable, _DIMENSION, None)


def trainable_variables(variables) -> list:
    """``variables`` (a model's trainable weights) with each split weight
    replaced by its shards, in order: what the step differentiates and
    the optimizer updates."""
    flat = []
    for variable in variables:
        flat.extend(shards_of(variable) or [variable])
    return flat


def _model_devices(layout: ModelLayout, strategy, what) -> List[List[str]]:
    """Each local replica's model devices: its row of the mesh
    (`tfdist.parallel.mesh_rows`)."""
    rows = mesh_rows.local_rows(layout.devices, strategy, layout.data_axis, what)
    replica_devices = list(strategy.extended.worker_devices) \
        if strategy is not None and strategy.num_replicas_in_sync > 1 else [rows[0][0]]
    if [mesh_rows.canonical(d) for d in replica_devices] != \
            [mesh_rows.canonical(row[0]) for row in rows]:
        warnings.warn(
            f"parallel={what!r}: the strategy's replicas run on {replica_devices}, but the "
            f"mesh's rows start at {[row[0] for row in rows]}: each step sends every "
            "replicated layer's activations between a replica's device and its model "
            "devices (results are unchanged). Make the strategy over the mesh's first "
            "column: tfdist.make_strategy('mirrored', devices="
            f"{[row[0] for row in layout.devices]}).", stacklevel=4)
    return rows


def _sequence_rules(layout: ModelLayout, what) -> list:
    """The output rules that split a sequence over the model axis, as
    (layer path, axes, axis); an output rule may otherwise lay the batch
    over the data axis (what the strategy's replicas hold already) and
    nothing else."""
    rules = []
    for path, axes in layout.outputs:
        if keras_distributions.splits_the_batch_only(axes, layout.data_axis):
            continue
        axis = sharded_sequence.sequence_axis(axes, layout.data_axis, layout.model_axis)
        if axis is None:
            raise ConfigurationError(
                f"parallel={what!r}: the rule for {path + '/output'!r} lays it out as {axes}; "
                f"tfdist lays outputs out over the batch (their first dimension on "
                f"{layout.data_axis!r}), and over {layout.model_axis!r} on one sequence "
                "dimension between the batch and the features (sequence parallelism, e.g. "
                f"({layout.data_axis!r}, {layout.model_axis!r}, None)). Change or drop the rule.")
        rules.append((path, tuple(axes), axis))
    keras_distributions.lay_out_outputs_on_the_batch(
        layout.data_axis, layout.model_axis if rules else None)
    return rules


_SPLIT_TYPES = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Embedding)


def _check_layer(what, layer, path: str, weights) -> None:
    where = f"parallel={what!r}: layer {path!r} ({type(layer).__name__}, rules " \
            f"{sorted({w.rule for w in weights})})"
    if type(layer) not in _SPLIT_TYPES:  # (a subclass may compute otherwise)
        raise ConfigurationError(
            f"{where}: tfdist runs split Dense, EinsumDense and Embedding layers; a split "
            f"{type(layer).__name__} is not built. Drop its rules to replicate it.")
    if not isinstance(layer, keras.layers.Embedding) and not any(
            w.path.endswith("kernel") for w in weights):
        raise ConfigurationError(f"{where} splits the bias without the kernel; split the "
                                 "kernel by columns with it, or drop the rule.")
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        raise ConfigurationError(f"{where}: a LoRA or quantized layer cannot be split yet.")
    if getattr(layer, "sparse", False):
        raise ConfigurationError(f"{where}: a sparse Embedding cannot be split yet.")
    for name in ("kernel_regularizer", "bias_regularizer", "embeddings_regularizer"):
        regularizer = getattr(layer, name, None)
        if regularizer is not None and not split_regularizers.separable(regularizer):
            raise ConfigurationError(
                f"{where} has a {name} ({regularizer!r}), which reads the weight whole: "
                "tfdist sums L1, L2 and L1L2 over a split weight's shards; others are not "
                "built for split weights. Drop it or the layer's rules.")
    for name in ("kernel_constraint", "bias_constraint", "embeddings_constraint"):
        if getattr(layer, name, None) is not None:
            raise ConfigurationError(
                f"{where} has a {name}, which reads the weight whole: not built for split "
                "weights yet. Drop it or the layer's rules.")


def _split(variable, dimension: int, per_replica: List[List[str]], strategy) -> list:
    """``variable``'s shards along ``dimension``, shard j on each
    replica's model device j, and ``variable`` made a view of them."""
    count = len(per_replica[0])
    storage = keras_model_state.tensorflow_variable(variable)
    parts = np.split(variable.numpy(), count, axis=dimension)
    shards = []
    for index, part in enumerate(parts):
        devices = [row[index] for row in per_replica]
        with tf.init_scope():
            if distributed_variables.is_distributed(storage):
                with strategy.scope(), distributed_variables.mirrored_on(strategy, devices):
                    shards.append(_shard_like(variable, part))
            else:
                with tf.device(devices[0]):
                    shards.append(_shard_like(variable, part))
    _keep_as_view(variable, shards, dimension)
    norm_groups.share_one_norm(shards)  # (clipnorm: the whole weight's norm)
    if getattr(variable, "regularizer", None) is not None:  # (separable: _check_layer)
        variable.regularizer = split_regularizers.on_shards(variable.regularizer, shards)
    return shards


def _shard_like(variable, value) -> keras.Variable:
    """A shard of ``variable``: its name and path (so its optimizer state is
    named, and its weight decay decided by name, as the weight's)."""
    with contextlib.ExitStack() as scopes:
        for name in variable.path.split("/")[:-1]:  # (a sublayer's: one scope per level)
            scopes.enter_context(keras.name_scope(name))
        return keras.Variable(value, dtype=variable.dtype, trainable=variable.trainable,
                              name=variable.name, aggregation=variable.aggregation)


def _keep_as_view(variable, shards: list, dimension: int) -> None:
    """``variable`` read and written whole through ``shards`` (module doc)."""
    path = variable.path

    def whole():
        with tf.device("/cpu:0"):
            return tf.concat([sliced_weights.whole(s) if sliced_weights.is_sliced(s) else
                              tf.convert_to_tensor(keras_model_state.tensorflow_variable(s))
                              for s in shards], axis=dimension)

    def assign_whole(value):
        for shard, part in zip(shards, tf.split(tf.convert_to_tensor(value), len(shards),
                                                axis=dimension)):
            shard.assign(part)

    def read_in_replica():
        if not tf.inside_function():
            return None  # (read whole: `whole`)
        raise ConfigurationError(
            f"weight {path!r} is split over the model axis: inside a step its layer reads "
            "its shards, and reading it whole would gather every shard. Something other "
            "than its layer's call read it (a regularizer, a layer sharing it, a model's "
            "own step): not built for split weights yet.")

    def worker_pieces():
        from tfdist.communication.sharded_checkpoints import WorkerPieces  # pylint: disable=import-outside-toplevel

        if not sliced_weights.is_sliced(shards[0]):
            return WorkerPieces(whole(), [], (0,), 1)  # (every shard is this worker's)
        return split_state.joined_worker_pieces(  # (each shard's slices: only this worker's)
            [shard.worker_pieces() for shard in shards], [tuple(s.shape) for s in shards],
            dimension)

    with tf.init_scope(), tf.device("/cpu:0"):
        placeholder = tf.Variable(tf.zeros([0], variable.dtype), trainable=False,
                                  shape=tf.TensorShape(None), name=f"{variable.name}_whole_view")
    sliced_weights.store_in_slices(variable, placeholder, sliced_weights.SlicedReads(
        read_in_replica, whole, assign_whole, worker_pieces))
    object.__setattr__(variable, _SHARDS, list(shards))
    object.__setattr__(variable, _DIMENSION, dimension)
