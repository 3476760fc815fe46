"""The conformance zoo through tensor-parallel layouts from Keras'
``LayoutMap`` (`tfdist.parallel.tensor_parallel`): every model family's
``Dense`` layers split in Megatron-LM pairs (columns, then rows) and its
``Embedding`` tables by vocabulary rows or columns, over a mesh of 1 x 2 (no
strategy) and 2 x 2 (MirroredStrategy over the mesh's first column, each
replica's weights over its 2 logical CPUs), and composed with a pipeline
(1 x 2 x 2: the pipeline zoo's cut into 2 stages, 3 micro-batches, each
stage's split layers over its own 2 CPUs), on every batch shape, against
single-device Keras on the same data and order (`harness.run_keras`).

The rules (`rules_for`) name each split weight by its path, as a user
writes them after printing ``[w.path for w in model.weights]``: every
``Dense`` (anywhere in the model, sublayers too) in model order takes
the column form, the next one the row form, and so on, when the split
dimension divides by 2 (else it stays whole); every ``Embedding`` whose
vocabulary divides by 2 is split by rows, else by columns when its width
does; every ``MultiHeadAttention`` with an even number of heads is split
by heads.

Families a layout cannot equal one device on are not skipped: each
one's refusal (a clear error naming what it cannot do) or warning is
asserted (`REPLICAS_EXPECTED`, `PIPELINE_EXPECTED`).

CI runs every third family once, taking turns over the layouts and batch
shapes, and each family a layout refuses; ``--conformance=full`` runs
every family x layout x batch shape.
"""

import dataclasses

import keras
import pytest
import tensorflow as tf

import tfdist
from conformance import harness, test_pipeline_zoo, zoo
from tfdist._internal.keras import layer_paths
from tfdist.errors import ConfigurationError

pytestmark = pytest.mark.conformance

LAYOUTS = ((1, 1, 2), (2, 1, 2), (1, 2, 2))  # (data, pipeline, model)
MICRO_BATCHES = 3  # (with a pipeline)

# Float16 round-off: where one device's matmul adds a column layer's input
# gradient (or a row layer's product) in one product, the model axis adds
# k partial ones, each rounded to float16 first (as Megatron-LM's
# all-reduce does). Seen: 2.4e-3 on one element of the partial-batch shape
# (the family's own bound, set for data parallelism, is 2e-3).
TOLERANCE = {"mixed_float16_embedding": 5e-3}
# With replicas (a mesh of 2 x 2) too: unsynchronized batch statistics.
REPLICAS_EXPECTED = {"cnn_batch_norm": (UserWarning, r"are not synchronized")}
# With a pipeline: each micro-batch's own batch statistics; a model's own
# step is refused (the pipeline cuts tfdist's step into micro-batches).
PIPELINE_EXPECTED = {name: (UserWarning, r"normalize each micro-batch by its own statistics")
                     for name in ("cnn_batch_norm", "cnn_sync_batch_norm")}
PIPELINE_EXPECTED.update({
    name: (ConfigurationError, r"does not combine with this model's own .* together with a "
                               r"pipeline")
    for name in ("own_train_step", "own_test_step", "keras_io_gan", "own_metrics_property")})


def _expected(case_name: str, layout):
    if layout[0] > 1 and case_name in REPLICAS_EXPECTED:
        return REPLICAS_EXPECTED[case_name]
    if layout[1] > 1 and case_name in PIPELINE_EXPECTED:
        return PIPELINE_EXPECTED[case_name]
    return None


def rules_for(model: keras.Model) -> dict:
    """The layout rules (module doc): ``{weight path: axes}``."""
    rules, column = {}, True
    for _, layer in layer_paths.walk(model):
        if type(layer) is keras.layers.Embedding and layer.input_dim % 2 == 0:
            rules[layer.embeddings.path] = ("model", None)
        elif type(layer) is keras.layers.Embedding and layer.output_dim % 2 == 0:
            rules[layer.embeddings.path] = (None, "model")
        if type(layer) is keras.layers.MultiHeadAttention and layer.num_heads % 2 == 0:
            for projection in (layer.query_dense, layer.key_dense, layer.value_dense):
                rules[projection.kernel.path] = (None, "model", None)
            rules[layer.output_dense.kernel.path] = ("model", None, None)
        if type(layer) is not keras.layers.Dense:
            continue
        rows, columns = layer.kernel.shape
        if column and columns % 2 == 0:
            rules[layer.kernel.path] = (None, "model")
            if layer.bias is not None:
                rules[layer.bias.path] = ("model",)
            column = False
        elif not column and rows % 2 == 0:
            rules[layer.kernel.path] = ("model", None)
            column = True
    return rules


def _layout_id(layout) -> str:
    data, stages, model_devices = layout
    return f"mesh_{data}x{model_devices}" if stages == 1 else \
        f"mesh_{data}x{stages}x{model_devices}"


def in_short_form(case_name: str, layout: tuple, shape: str) -> bool:
    """CI: every third family (zoo order) and each family a layout refuses,
    once, layouts (among the every-third families, by their own turn) and
    batch shapes in turn."""
    turn = [c.name for c in zoo.CASES].index(case_name)
    if turn % 3 and _expected(case_name, layout) is None:
        return False
    layout_turn = turn if turn % 3 else turn // 3
    return (layout, shape) == (LAYOUTS[layout_turn % len(LAYOUTS)],
                               tuple(harness.BATCH_SHAPES)[turn % len(harness.BATCH_SHAPES)])


def _options(layout):
    """`tfdist.attach`'s options for ``layout``, from the model (its
    weights' paths are Keras' automatic ones, different in every build)."""
    data, stages, model_devices = layout
    devices = [f"/cpu:{index}" for index in range(data * stages * model_devices)]

    def options(model):
        if stages == 1:
            mesh = keras.distribution.DeviceMesh((data, model_devices), ["batch", "model"],
                                                 devices)
        else:
            mesh = keras.distribution.DeviceMesh((data, stages, model_devices),
                                                 ["batch", "pipeline", "model"], devices)
        layout_map = keras.distribution.LayoutMap(mesh)
        for path, axes in rules_for(model).items():
            layout_map[path] = axes
        distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                        batch_dim_name="batch")
        if stages == 1:
            return {"parallel": distribution}
        pipeline = tfdist.parallel.Pipeline(cuts=test_pipeline_zoo.cuts_for(model, stages),
                                            micro_batches=MICRO_BATCHES)
        return {"parallel": [pipeline, distribution]}

    return options


def _strategy(layout):
    data, _, model_devices = layout
    if data == 1:
        return tf.distribute.get_strategy()
    return tfdist.make_strategy("mirrored", devices=[
        f"/cpu:{index}" for index in range(0, data * model_devices, model_devices)])


@pytest.mark.parametrize("case_name,layout,shape", list(harness.split_matrix(LAYOUTS, in_short_form, _layout_id)))
def test_a_tensor_parallel_layout_equals_one_device(case_name, layout, shape):
    case = zoo.BY_NAME[case_name]
    if case_name in TOLERANCE:
        case = dataclasses.replace(case, tolerance=TOLERANCE[case_name])
    row = dict(case=case_name, strategy=f"tensor_parallel_{_layout_id(layout)}", shape=shape,
               entry="attach")
    examples = harness.BATCH_SHAPES[shape]
    initial, reference = harness.reference_of(case_name, examples)
    harness.check_split(case, _strategy(layout), examples, initial, reference, row,
                        _options(layout), _expected(case_name, layout))


# Families the rule leaves whole (no Dense or Embedding with an even
# dimension): their rows check that a layout splitting nothing changes nothing.
UNSPLIT = {"cnn_batch_norm", "cnn_sync_batch_norm", "separable_cnn", "keras_io_gan"}


def test_the_rule_splits_every_family_but_the_named_ones():
    """(A family the rule left whole would test nothing but `UNSPLIT`.)"""
    for case in zoo.CASES:
        model = case.build()
        split = bool(model.built and rules_for(model))
        assert split == (case.name not in UNSPLIT), case.name
