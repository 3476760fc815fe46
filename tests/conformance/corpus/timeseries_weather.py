"""keras.io "Timeseries forecasting for weather prediction": windows of
normalized features made by ``timeseries_dataset_from_array``, an LSTM, a
Dense output; Adam and mean squared error.

Changes: 7 features -> 3, sequences of 120 steps -> 6, LSTM 32 -> 4 units,
a random walk for the Jena climate record, epochs 10 -> 2, fit on arrays
taken from the windows (the example fits the windowed dataset: the
conformance axes run datasets).
"""

import keras
import numpy as np

SOURCE = "https://keras.io/examples/timeseries/timeseries_weather_forecasting/"
SEQUENCE_LENGTH = 6
FIT = dict(epochs=2)


def build():
    keras.utils.set_random_seed(16)
    inputs = keras.layers.Input(shape=(SEQUENCE_LENGTH, 3))
    lstm_out = keras.layers.LSTM(4)(inputs)
    outputs = keras.layers.Dense(1)(lstm_out)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001), loss="mse")
    return model


def data(examples):
    rng = np.random.RandomState(5)
    series = np.cumsum(rng.randn(examples + SEQUENCE_LENGTH, 3), axis=0).astype("float32")
    series = (series - series.mean(axis=0)) / series.std(axis=0)
    windows = keras.utils.timeseries_dataset_from_array(
        series[:-1], series[SEQUENCE_LENGTH:, :1], sequence_length=SEQUENCE_LENGTH,
        batch_size=examples)
    x, y = next(iter(windows))
    return x.numpy()[:examples], y.numpy()[:examples]
