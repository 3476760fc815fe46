"""keras.io "Large-scale multi-label text classification": multi-hot
(bag-of-words) abstracts, two hidden layers, one sigmoid per label;
Adam, binary cross-entropy, binary accuracy.

Changes: a vocabulary of thousands -> 16 terms, 512 / 256 units -> 8 / 8,
the arXiv abstracts -> random multi-hot rows with 5 labels, epochs 20 -> 2.
"""

import keras
import numpy as np
from keras import layers

SOURCE = "https://keras.io/examples/nlp/multi_label_classification/"
VOCABULARY, LABELS = 16, 5
FIT = dict(epochs=2)


def make_model():
    return keras.Sequential([
        keras.Input((VOCABULARY,)),
        layers.Dense(8, activation="relu"),
        layers.Dense(8, activation="relu"),
        layers.Dense(LABELS, activation="sigmoid"),
    ])


def build():
    keras.utils.set_random_seed(18)
    shallow_mlp_model = make_model()
    shallow_mlp_model.compile(loss="binary_crossentropy", optimizer="adam",
                              metrics=["binary_accuracy"])
    return shallow_mlp_model


def data(examples):
    rng = np.random.RandomState(7)
    x = (rng.uniform(size=(examples, VOCABULARY)) > 0.7).astype("float32")
    y = np.stack([x[:, label] + x[:, label + 5] > 0 for label in range(LABELS)], 1)
    return x, y.astype("float32")
