"""keras.io "Image similarity estimation using a Siamese Network with a
contrastive loss": one tower applied to both images, the Euclidean
distance between the embeddings, BatchNormalization, a sigmoid, and the
example's contrastive loss (``ops.mean``: a scalar); RMSprop.

Changes: 28x28 images -> 8 features, the tower's convolutions -> Dense
layers, random pairs for MNIST, epochs 10 -> 2, both BatchNormalization
layers synchronized (unsynchronized, each replica normalizes its own rows:
tfdist warns, naming the layers).
"""

import keras
import numpy as np
from keras import layers, ops

SOURCE = "https://keras.io/examples/vision/siamese_contrastive/"
FIT = dict(epochs=2)
WARNS = r"'contrastive_loss' returns a scalar"


def euclidean_distance(vects):
    x, y = vects
    sum_square = ops.sum(ops.square(x - y), axis=1, keepdims=True)
    return ops.sqrt(ops.maximum(sum_square, keras.backend.epsilon()))


def loss(margin=1):
    def contrastive_loss(y_true, y_pred):
        square_pred = ops.square(y_pred)
        margin_square = ops.square(ops.maximum(margin - (y_pred), 0))
        return ops.mean((1 - y_true) * square_pred + (y_true) * margin_square)
    return contrastive_loss


def build():
    keras.utils.set_random_seed(15)
    input_tower = keras.Input((8,))
    x = layers.BatchNormalization(synchronized=True)(input_tower)  # test: synchronized
    x = layers.Dense(6, activation="tanh")(x)
    embedding_network = keras.Model(input_tower, layers.Dense(4, activation="tanh")(x))
    input_1, input_2 = keras.Input((8,)), keras.Input((8,))
    tower_1, tower_2 = embedding_network(input_1), embedding_network(input_2)
    merge_layer = layers.Lambda(euclidean_distance, output_shape=(1,))([tower_1, tower_2])
    normal_layer = layers.BatchNormalization(synchronized=True)(merge_layer)  # test: synchronized
    output_layer = layers.Dense(1, activation="sigmoid")(normal_layer)
    siamese = keras.Model(inputs=[input_1, input_2], outputs=output_layer)
    siamese.compile(loss=loss(margin=1), optimizer="RMSprop", metrics=["accuracy"])
    return siamese


def data(examples):
    rng = np.random.RandomState(4)
    left, right = rng.randn(examples, 8).astype("float32"), rng.randn(examples, 8).astype("float32")
    return [left, right], (left[:, 0] * right[:, 0] > 0).astype("float32")
