"""tfdist.attach: unchanged Keras fit / evaluate / predict code, exact under
any replica count, against single-device Keras on the same data and order."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.support import reference as ref
from tests.support import short_form
from tfdist.errors import ConfigurationError

EPOCHS, BATCH = 2, 16
# 70 rows with validation_split=0.2: 56 train (last batch 8), 14 validation;
# 66 rows without split: last batch 2 (empty replicas at 3-4 replicas).


def _attached(strategy, optimizer="adam", build=ref.build_mlp):
    with strategy.scope():
        model = ref.compile_model(build(), optimizer)
    return tfdist.attach(model, strategy)


def _assert_same_history(expected, actual):
    assert actual.epoch == expected.epoch
    ref.assert_logs_close(expected.history, actual.history)


@pytest.mark.parametrize("num_replicas", short_form.only([1, 2, 4], in_ci=(4,)))
def test_fit_on_arrays_with_validation_split_and_class_weight(make_strategy, num_replicas):
    x, y, _ = ref.classification_arrays(70)
    kwargs = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_split=0.2,
                  class_weight={0: 1.0, 1: 2.5, 2: 0.5}, verbose=0)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    expected_history = expected.fit(x, y, **kwargs)

    model = _attached(make_strategy(num_replicas))
    history = model.fit(x, y, **kwargs)

    assert isinstance(history, keras.callbacks.History) and history is model.history
    _assert_same_history(expected_history, history)
    ref.assert_weights_close(expected, model)
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=BATCH, verbose=0),
                               expected.evaluate(x, y, batch_size=BATCH, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(model.predict(x, batch_size=BATCH, verbose=0),
                               expected.predict(x, batch_size=BATCH, verbose=0), atol=1e-5)


@pytest.mark.parametrize("num_replicas", [3, 4])
def test_sample_weight_validation_data_and_empty_replicas(make_strategy, num_replicas):
    x, y, w = ref.classification_arrays(66)
    xv, yv, wv = ref.classification_arrays(21, seed=5)
    kwargs = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=False, sample_weight=w,
                  validation_data=(xv, yv, wv), validation_batch_size=8, verbose=0)
    expected = ref.compile_model(ref.build_mlp(), "sgd")
    expected_history = expected.fit(x, y, **kwargs)

    model = _attached(make_strategy(num_replicas), "sgd")
    _assert_same_history(expected_history, model.fit(x, y, **kwargs))
    ref.assert_weights_close(expected, model)


def _reference_order(num_rows, shuffle, epoch, seed=0):
    """The documented order: NumPy's RandomState(tfdist.data.epoch_seed(seed, epoch))."""
    rng = np.random.RandomState(tfdist.data.epoch_seed(seed, epoch))
    if shuffle is True:
        return rng.permutation(num_rows)
    full = num_rows // BATCH
    order = [b * BATCH + i for b in rng.permutation(full) for i in range(BATCH)]
    return np.array(order + list(range(full * BATCH, num_rows)))


@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_shuffle_is_seeded_per_epoch_and_equals_keras_on_that_order(make_strategy, shuffle):
    x, y, _ = ref.classification_arrays(70)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    losses = []
    for epoch in range(EPOCHS):  # one-device Keras, fed each epoch's order
        order = _reference_order(70, shuffle, epoch)
        losses += expected.fit(x[order], y[order], batch_size=BATCH, epochs=1,
                               shuffle=False, verbose=0).history["loss"]

    model = _attached(make_strategy(4))
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=shuffle, verbose=0)

    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-5)
    ref.assert_weights_close(expected, model)


def test_initial_epoch_and_validation_freq(make_strategy):
    x, y, _ = ref.classification_arrays(64)
    kwargs = dict(batch_size=BATCH, epochs=5, initial_epoch=2, validation_split=0.25,
                  validation_freq=2, shuffle=False, verbose=0)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    expected_history = expected.fit(x, y, **kwargs)

    model = _attached(make_strategy(2))
    history = model.fit(x, y, **kwargs)

    assert history.epoch == [2, 3, 4]
    _assert_same_history(expected_history, history)
    assert len(history.history["val_loss"]) == 1  # only after epoch 4 (the 2nd-freq epoch)


def _two_in_two_out():
    keras.utils.set_random_seed(3)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Dense(6, activation="relu")(keras.layers.Concatenate()([a, b]))
    outputs = {"cls": keras.layers.Dense(3, activation="softmax", name="cls")(h),
               "reg": keras.layers.Dense(1, name="reg")(h)}
    return keras.Model({"a": a, "b": b}, outputs)


def _compile_two_out(model):
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
                  loss_weights={"cls": 1.0, "reg": 0.5}, metrics={"cls": ["accuracy"]})
    return model


def test_multi_input_multi_output_dicts(make_strategy):
    rng = np.random.RandomState(0)
    x = {"a": rng.rand(64, 3).astype("float32"), "b": rng.rand(64, 2).astype("float32")}
    y = {"cls": rng.randint(0, 3, 64), "reg": rng.rand(64, 1).astype("float32")}
    expected = _compile_two_out(_two_in_two_out())
    expected_history = expected.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)

    strategy = make_strategy(4)
    with strategy.scope():
        model = _compile_two_out(_two_in_two_out())
    tfdist.attach(model, strategy)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)

    _assert_same_history(expected_history, history)
    ref.assert_weights_close(expected, model)
    predicted, wanted = model.predict(x, batch_size=24, verbose=0), expected.predict(
        x, batch_size=24, verbose=0)
    assert isinstance(predicted, dict) and sorted(predicted) == sorted(wanted)
    for key in wanted:
        np.testing.assert_allclose(predicted[key], wanted[key], atol=1e-5)


@pytest.mark.parametrize("num_replicas", [1, 4])
def test_evaluate_returns_what_keras_returns(make_strategy, num_replicas):
    x, y, _ = ref.classification_arrays(66)
    strategy = make_strategy(num_replicas)
    with strategy.scope():
        loss_only = ref.build_mlp()
        loss_only.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    reference = ref.build_mlp()
    reference.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    tfdist.attach(loss_only, strategy)

    scalar = loss_only.evaluate(x, y, batch_size=BATCH, verbose=0)
    assert isinstance(scalar, float)
    np.testing.assert_allclose(scalar, reference.evaluate(x, y, batch_size=BATCH, verbose=0),
                               rtol=1e-5)
    full = _attached(strategy)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    listed = full.evaluate(x, y, batch_size=BATCH, verbose=0)
    assert isinstance(listed, list)
    np.testing.assert_allclose(listed, expected.evaluate(x, y, batch_size=BATCH, verbose=0),
                               rtol=1e-5)
    ref.assert_logs_close(expected.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True),
                          full.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True))


class _Rows(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.x) // BATCH)

    def __getitem__(self, index):
        rows = slice(index * BATCH, (index + 1) * BATCH)
        return self.x[rows], self.y[rows]


def test_pydataset_and_dataset_inputs(make_strategy):
    x, y, _ = ref.classification_arrays(70)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    expected_history = expected.fit(_Rows(x, y), epochs=2, shuffle=False, verbose=0)

    model = _attached(make_strategy(2))
    _assert_same_history(expected_history,
                         model.fit(_Rows(x, y), epochs=2, shuffle=False, verbose=0))
    ref.assert_weights_close(expected, model)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    np.testing.assert_allclose(model.predict(dataset, verbose=0),
                               expected.predict(dataset, verbose=0), atol=1e-5)
    np.testing.assert_allclose(model.predict(_Rows(x, y), verbose=0),
                               expected.predict(_Rows(x, y), verbose=0), atol=1e-5)


class _InOrder(keras.utils.PyDataset):
    def __init__(self, rows, order):
        super().__init__()
        self.rows, self.order = rows, order

    def __len__(self):
        return len(self.order)

    def __getitem__(self, index):
        return self.rows[int(self.order[index])]


def test_pydataset_shuffle_is_a_seeded_batch_order_per_epoch(make_strategy):
    x, y, _ = ref.classification_arrays(70)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    losses = []
    for epoch in range(3):  # one-device Keras, fed each epoch's documented order
        order = np.random.RandomState(tfdist.data.epoch_seed(0, epoch)).permutation(5)
        losses += expected.fit(_InOrder(_Rows(x, y), order), epochs=1, shuffle=False,
                               verbose=0).history["loss"]
    model = _attached(make_strategy(4))
    history = model.fit(_Rows(x, y), epochs=3, shuffle=True, verbose=0)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-5)
    ref.assert_weights_close(expected, model)


def test_detach_gives_back_keras_methods_and_recompile_takes_effect(make_strategy):
    model = _attached(make_strategy(2))
    assert tfdist.training.keras_fit.attachment_of(model) is not None
    x, y, _ = ref.classification_arrays(32)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    first = tfdist.training.keras_fit.attachment_of(model).trainer()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    assert tfdist.training.keras_fit.attachment_of(model).trainer() is not first

    tfdist.detach(model)
    assert tfdist.training.keras_fit.attachment_of(model) is None
    assert model.fit.__func__ is keras.Model.fit


def test_model_built_outside_the_scope_is_a_clear_error(make_strategy):
    outside = ref.compile_model(ref.build_mlp(), "adam")
    with pytest.raises(ConfigurationError, match="created under .*not the MirroredStrategy"):
        tfdist.attach(outside, make_strategy(2))
    other = make_strategy(2)
    with other.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    with pytest.raises(ConfigurationError, match="strategy.scope()"):
        tfdist.attach(model, make_strategy(4))


@pytest.mark.parametrize("call, named", [
    (lambda m, x, y, w: m.fit(x, y, class_weight={0: 2.0}, sample_weight=w), "class_weight"),
    (lambda m, x, y, w: m.fit(x, y, shuffle="yes"), "`shuffle`"),
    (lambda m, x, y, w: m.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
                              validation_split=0.2), "`validation_split` needs arrays"),
    (lambda m, x, y, w: m.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), y),
     "`y` must be None"),
    (lambda m, x, y, w: m.fit(x, y, validation_split=1.5), "`validation_split`"),
    (lambda m, x, y, w: m.fit(x, None), "`y` is None"),
    (lambda m, x, y, w: m.fit("data.csv", y), "`x` is a str"),
])
def test_bad_fit_arguments_name_the_argument(make_strategy, call, named):
    model = _attached(make_strategy(2))
    x, y, w = ref.classification_arrays(32)
    with pytest.raises(ConfigurationError, match=named):
        call(model, x, y, w)


def test_verbose_prints_keras_progress_bar_or_one_line_per_epoch(make_strategy, capfd):
    x, y, _ = ref.classification_arrays(66)
    model = _attached(make_strategy(2))
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    assert capfd.readouterr().out == ""
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=2, validation_split=0.2)
    lines = [l for l in capfd.readouterr().out.splitlines() if l.strip()]
    assert lines[0] == "Epoch 1/2" and lines[2] == "Epoch 2/2" and len(lines) == 4
    assert lines[1].startswith("4/4 - ") and " - loss: " in lines[1] and "val_loss" in lines[1]
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=1)
    out = capfd.readouterr().out
    assert "5/5" in out and "━" in out
    with pytest.raises(ConfigurationError, match=r"`verbose` \(3\)"):
        model.fit(x, y, batch_size=BATCH, verbose=3)


def test_on_batch_methods_equal_keras_with_empty_replicas(make_strategy):
    x, y, w = ref.classification_arrays(50)
    batches = [(x[:16], y[:16], w[:16]), (x[16:18], y[16:18], w[16:18]), (x[18:], y[18:], w[18:])]

    def calls(model):
        results = [model.train_on_batch(bx, by, sample_weight=bw) for bx, by, bw in batches]
        results.append(model.test_on_batch(x[:7], y[:7]))
        results.append(model.train_on_batch(x[:3], y[:3], class_weight={0: 2.0, 1: 1.0, 2: 0.5},
                                            return_dict=True))
        results.append(model.predict_on_batch(x[:5]))
        return results

    expected = calls(ref.compile_model(ref.build_mlp(), "adam"))
    actual = calls(_attached(make_strategy(4)))
    for index, (want, got) in enumerate(zip(expected, actual)):
        if isinstance(want, dict):
            ref.assert_logs_close(want, got)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"call {index}")


def test_trainer_takes_keras_data_arguments_too(make_strategy):
    """Trainer.fit / evaluate / predict accept Keras' arguments (no attach)."""
    x, y, w = ref.classification_arrays(66)
    kwargs = dict(batch_size=BATCH, epochs=2, validation_split=0.25, shuffle=False,
                  sample_weight=w, verbose=0)
    expected = ref.compile_model(ref.build_mlp(), "adam")
    expected_history = expected.fit(x, y, **kwargs)
    strategy = make_strategy(4)
    with strategy.scope():
        model = ref.compile_model(ref.build_mlp(), "adam")
    trainer = tfdist.Trainer(model, strategy)
    _assert_same_history(expected_history, trainer.fit(x, y, **kwargs))
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected.evaluate(x, y, batch_size=8, verbose=0, return_dict=True),
                          trainer.evaluate(x, y, batch_size=8))
    np.testing.assert_allclose(trainer.predict(x, batch_size=8),
                               expected.predict(x, batch_size=8, verbose=0), atol=1e-5)
