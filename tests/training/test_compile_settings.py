"""``model.compile(steps_per_execution=..., jit_compile=...)`` is read by
`tfdist.attach` and `tfdist.Trainer`, never silently dropped, and given
nowhere else."""

import warnings

import keras
import pytest

import tfdist
from tests.support import reference as ref
from tfdist.errors import ConfigurationError
from tfdist.training.keras_fit import attachment_of


def _model(strategy, **compile_options):
    with strategy.scope():
        model = ref.build_mlp()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                      **compile_options)
    return model


def test_compiled_steps_per_execution_is_used_and_stays_exact(make_strategy):
    x, y, _ = ref.classification_arrays(70)
    expected = ref.build_mlp()
    expected.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                     steps_per_execution=4)
    expected_history = expected.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    model = tfdist.attach(_model(make_strategy(2), steps_per_execution=4))
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert attachment_of(model).trainer().steps_per_execution == 4
    ref.assert_weights_close(expected, model)
    ref.assert_logs_close(expected_history.history, history.history)


def test_compiled_jit_compile_is_used(make_strategy):
    model = tfdist.attach(_model(make_strategy(2), jit_compile=True))
    assert attachment_of(model).trainer()._steps._jit_compile is True


@pytest.mark.parametrize("name", ["steps_per_execution", "jit_compile"])
@pytest.mark.parametrize("entry", ["attach", "Trainer"])
def test_a_setting_compile_owns_is_given_in_compile_only(make_strategy, entry, name):
    strategy = make_strategy(2)
    with pytest.raises(ConfigurationError,
                       match=rf"tfdist\.{entry}'s options moved: `{name}=` is now "
                             rf"`model\.compile\({name}=\.\.\.\)`"):
        getattr(tfdist, entry)(_model(strategy), strategy, **{name: 2})


def test_xla_for_a_model_with_its_own_step_is_a_warning_not_silence(make_strategy):
    class Own(keras.Model):
        def compute_loss(self, *args, **kwargs):
            return super().compute_loss(*args, **kwargs)

    strategy = make_strategy(2)
    with strategy.scope():
        base = ref.build_mlp()
        model = Own(base.inputs, base.outputs)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=True)
    tfdist.attach(model, strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = attachment_of(model).trainer()
    assert any("without XLA" in str(w.message) for w in caught)
    assert trainer.steps_per_execution == 1
