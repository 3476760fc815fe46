"""keras.io "Text classification from scratch": an embedding, two strided
1D convolutions, global max pooling, a hidden layer, a sigmoid; Adam and
binary cross-entropy.

Changes: 20000 features -> 25, sequences of 500 -> 12, embedding 128 ->
8, 128 filters / units -> 4 / 8, dropout 0.5 -> 0, the IMDB reviews ->
random ids, epochs 3 -> 2.
"""

import keras
import numpy as np
from keras import layers

SOURCE = "https://keras.io/examples/nlp/text_classification_from_scratch/"
MAX_FEATURES, SEQUENCE_LENGTH = 25, 12
FIT = dict(epochs=2)


def build():
    keras.utils.set_random_seed(20)
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = layers.Embedding(MAX_FEATURES, 8)(inputs)
    x = layers.Dropout(0.0)(x)
    x = layers.Conv1D(4, 3, padding="valid", activation="relu", strides=2)(x)
    x = layers.Conv1D(4, 3, padding="valid", activation="relu", strides=2)(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dense(8, activation="relu")(x)
    x = layers.Dropout(0.0)(x)
    predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def data(examples):
    rng = np.random.RandomState(9)
    x = rng.randint(0, MAX_FEATURES, size=(examples, SEQUENCE_LENGTH)).astype("int64")
    return x, (x[:, :3].sum(axis=1) > 36).astype("float32")
