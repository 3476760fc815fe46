"""keras.io "Structured data classification from scratch" (Keras 3
version): named inputs, numerical features normalized in the model,
integer and string categories one-hot encoded by lookup layers, a hidden
layer, a sigmoid; Adam and binary cross-entropy.

Changes: the heart-disease table -> 4 generated columns (2 numerical, an
integer and a string category), Dense 32 -> 8, dropout 0.5 -> 0, epochs
50 -> 2, batches of 32 -> 24; the lookups and normalization are adapted
on the training data as in the example.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

SOURCE = "https://keras.io/examples/structured_data/structured_data_classification_from_scratch/"
FIT = dict(epochs=2)


def _columns(examples):
    rng = np.random.RandomState(6)
    return {"age": rng.uniform(30, 70, examples).astype("float32"),
            "chol": rng.uniform(150, 300, examples).astype("float32"),
            "sex": rng.randint(0, 2, examples).astype("int64"),
            "thal": np.array(["fixed", "normal", "reversible"])[rng.randint(0, 3, examples)]}


def encode_numerical_feature(feature, name, values):
    normalizer = layers.Normalization()
    normalizer.adapt(values[:, None])
    return normalizer(feature)


def encode_categorical_feature(feature, name, values, is_string):
    lookup_class = layers.StringLookup if is_string else layers.IntegerLookup
    lookup = lookup_class(output_mode="binary")
    lookup.adapt(values)
    return lookup(feature)


def build():
    keras.utils.set_random_seed(17)
    columns = _columns(107)
    inputs = {"age": keras.Input(shape=(1,), name="age"),
              "chol": keras.Input(shape=(1,), name="chol"),
              "sex": keras.Input(shape=(1,), name="sex", dtype="int64"),
              "thal": keras.Input(shape=(1,), name="thal", dtype="string")}
    all_features = layers.concatenate([
        encode_categorical_feature(inputs["sex"], "sex", columns["sex"], False),
        encode_categorical_feature(inputs["thal"], "thal", columns["thal"], True),
        encode_numerical_feature(inputs["age"], "age", columns["age"]),
        encode_numerical_feature(inputs["chol"], "chol", columns["chol"]),
    ])
    x = layers.Dense(8, activation="relu")(all_features)
    x = layers.Dropout(0.0)(x)
    output = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, output)
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model


def data(examples):
    columns = _columns(examples)
    x = {name: values[:, None] for name, values in columns.items()}
    y = ((columns["age"] > 50) ^ (columns["thal"] == "normal")).astype("float32")
    # As the example: a dataset of (dict of columns, label) batches.
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(24), None
