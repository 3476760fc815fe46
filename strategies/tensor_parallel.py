"""keras.io's "Distributed training with Keras" model-parallel program, on
TensorFlow: the same DeviceMesh, LayoutMap and ModelParallel a Keras-on-JAX
user writes, run by tfdist.

    python strategies/tensor_parallel.py                  # mesh 2x4: 8 devices
    python strategies/tensor_parallel.py --mesh=1x2 --epochs=1

Without GPUs, data x model logical CPU devices are made. The mesh's data
axis is a MirroredStrategy's replicas (the model is built in its scope, as
every tfdist data-parallel program is); the model axis splits the weights
the layout's rules name over each replica's row of the mesh. Against the
guide, the TensorFlow program adds the strategy (over the mesh's first
column, each replica's first model device; the model built in its scope) and
``tfdist.attach(model, strategy)``, which reads the distribution set with
``keras.distribution.set_distribution``. The guide's ``d1/bias`` rule
matches no weight (its layer has no bias): tfdist says so in a warning, and
changes nothing, as Keras does.
"""

from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
flags.DEFINE_string("mesh", "2x4", "Mesh shape, data x model.")
flags.DEFINE_integer("epochs", 3, "Epochs to train.")


def main(argv):
    del argv
    data, model_devices = (int(size) for size in FLAGS.mesh.split("x"))
    # First: logical devices must be configured before TensorFlow starts.
    tfdist.strategies.configure_logical_cpus(data * model_devices)  # (a no-op with GPUs)
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    # The guide's program from here, the backend TensorFlow.
    devices = keras.distribution.list_devices()[:data * model_devices]
    mesh_2d = keras.distribution.DeviceMesh(
        shape=(data, model_devices), axis_names=["data", "model"], devices=devices)
    layout_map = keras.distribution.LayoutMap(mesh_2d)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d1/bias"] = ("model",)
    layout_map["d2/output"] = ("data", None)
    model_parallel = keras.distribution.ModelParallel(layout_map=layout_map,
                                                      batch_dim_name="data")
    keras.distribution.set_distribution(model_parallel)
    # tfdist: the data axis' replicas, on the mesh's first column.
    strategy = tfdist.make_strategy("mirrored", devices=devices[::model_devices])

    inputs = np.random.normal(size=(128, 28, 28, 1))
    labels = np.random.normal(size=(128, 10))
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(16)

    with strategy.scope():
        model = get_model()
        model.compile(loss="mse")
    tfdist.attach(model, strategy)
    history = model.fit(dataset, epochs=FLAGS.epochs)
    print(f"loss by epoch: {[round(loss, 4) for loss in history.history['loss']]}")
    shards = tfdist.parallel.tensor_parallel.shards_of(model.get_layer("d1").kernel)
    print(f"d1/kernel {tuple(model.get_layer('d1').kernel.shape)}: {len(shards)} shards of "
          f"{tuple(shards[0].shape)} per replica")


def get_model():
    """The guide's model: a column-split Dense between replicated layers."""
    import keras  # pylint: disable=import-outside-toplevel

    inputs = keras.layers.Input(shape=(28, 28, 1))
    y = keras.layers.Flatten()(inputs)
    y = keras.layers.Dense(units=200, use_bias=False, activation="relu", name="d1")(y)
    y = keras.layers.Dropout(0.4)(y)
    y = keras.layers.Dense(units=10, activation="softmax", name="d2")(y)
    return keras.Model(inputs=inputs, outputs=y)


if __name__ == "__main__":
    app.run(main)
