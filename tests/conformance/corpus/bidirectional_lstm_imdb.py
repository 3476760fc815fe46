"""keras.io "Bidirectional LSTM on IMDB": an embedding, two bidirectional
LSTMs, a sigmoid; Adam and binary cross-entropy.

Changes: 20000 words -> 25, 200 tokens -> 8, embedding 128 -> 8, LSTM 64 ->
4 units, random ids for the reviews, epochs 2 -> 1 (the example trains 2:
the one epoch keeps the recurrent test short).
"""

import keras
import numpy as np
from keras import layers

SOURCE = "https://keras.io/examples/nlp/bidirectional_lstm_imdb/"
MAX_FEATURES, MAXLEN = 25, 8
FIT = dict(epochs=1)


def build():
    keras.utils.set_random_seed(13)
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(MAX_FEATURES, 8)(inputs)
    x = layers.Bidirectional(layers.LSTM(4, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(4))(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def data(examples):
    rng = np.random.RandomState(2)
    x = rng.randint(1, MAX_FEATURES, size=(examples, MAXLEN)).astype("int32")
    return x, (x[:, 0] > x[:, 1]).astype("float32")
