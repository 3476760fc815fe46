"""A model's layers and state: building every variable before the first
step, listing layers, the random layers' seed generators, the TensorFlow
variable behind a Keras variable. Users: the Trainer, the checkpoint, the
TPU preflight, tfdist's warnings, `tfdist.strategies` (sharded variables,
atomic counters).
Tested with Keras 3.15 and 3.16; `tests/_internal/test_keras_contract.py` pins what it reads.
"""

import keras


def seed_generator_states(model: keras.Model) -> dict:
    """The state variables of the random layers' ``SeedGenerator``s (which
    ``tf.train.Checkpoint`` does not reach through the model), named by the
    layer's position in ``model`` and the generator's in the layer: stable
    for the same architecture, whatever Keras named the layers."""
    return {f"layer_{index}_seed_{number}": generator.state
            for index, layer in enumerate(model._flatten_layers(include_self=True))
            for number, generator in enumerate(getattr(layer, "_seed_generators", []))}


def tensorflow_variable(variable):
    """The TensorFlow variable behind a Keras variable, as it is stored
    (not cast under an autocast scope, as ``.value`` is; a ShardedVariable
    under a partitioner); anything else as it is."""
    return variable._value if isinstance(variable, keras.Variable) else variable


def all_layers(model: keras.Model) -> list:
    """Every layer inside ``model``, nested ones included (not the model)."""
    return list(model._flatten_layers(include_self=False))


def weights_built(model: keras.Model) -> bool:
    """Whether ``model`` and every layer inside it are built. Keras marks a
    subclassed model without a ``build`` method built by
    ``model.build(input_shape)`` even when that could not build its layers
    (it warns): they make their weights on the first batch, as if the model
    were not built (keras.io's RecommenderNet)."""
    return model.built and all(layer.built for layer in model._flatten_layers(include_self=False))


def build_model_state(model: keras.Model, element_spec) -> None:
    """Creates model, compiled-loss, metric and optimizer variables.

    ``element_spec`` is a dataset's ``(x, y[, sample_weight])`` TensorSpecs;
    no data is read. Must run inside ``strategy.scope()`` so the variables
    become distributed variables.

    A model without ``call()`` whose layers are built (keras.io's GAN: two
    built sub-models, its own ``train_step``; its distiller: a teacher, a
    student and compiled metrics) cannot be run symbolically; on one device
    Keras leaves it to its first step, which builds what is left (its
    optimizers in ``apply``, its compiled metrics in their first update):
    so does tfdist.
    """
    if type(model).call is keras.Model.call and all(
            layer.built for layer in model._flatten_layers(include_self=False)):
        model.built = True
        return
    model._symbolic_build(data_batch=element_spec)


def build_layers(model: keras.Model, element_spec) -> None:
    """Builds the model's weights from a dataset's element spec, as
    `build_model_state` does, but leaves its optimizer unbuilt.

    A pipeline given before Keras built the model (a subclassed model, a
    ``Sequential`` without an ``Input``: built on the first batch) places
    the weights here, before the optimizer makes their state beside them
    (`tfdist.parallel.plan`). Keras' symbolic build builds the
    optimizer unless it is built, so it is marked built meanwhile.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        build_model_state(model, element_spec)
        return
    was_built = optimizer.built
    optimizer.built = True
    try:
        build_model_state(model, element_spec)
    finally:
        optimizer.built = was_built
