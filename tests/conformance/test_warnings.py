"""What tfdist cannot make exact is a warning naming it, never silence."""

import pytest

import tfdist
from conformance import zoo
from tests.support import strategy_columns

pytestmark = pytest.mark.conformance


def _attached_fit(build, strategy, **compile_options):
    with strategy.scope():
        model = build()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", **compile_options)
    tfdist.attach(model, strategy)
    model.fit(zoo.features(30, 8) if model.input_shape[-1] == 6 else zoo.images(30, 8),
              epochs=1, verbose=0)


def test_unsynchronized_batch_normalization_is_named_under_replicas():
    with pytest.warns(UserWarning, match=r"BatchNormalization layers \['batch_normalization.*"
                                         r"not synchronized.*synchronized=True"):
        _attached_fit(zoo.cnn(synchronized=False),
                      tfdist.make_strategy("mirrored", num_replicas=2))


def test_activity_regularizers_under_xla_are_named():
    with pytest.warns(UserWarning, match=r"Layers \['dense.*activity_regularizer.*jit_compile"):
        _attached_fit(zoo.mlp(activity_l2=0.01), tfdist.make_strategy("mirrored", num_replicas=3),
                      jit_compile=True)


@pytest.mark.parametrize("build, replicas", [(zoo.cnn(synchronized=False), 1),
                                             (zoo.cnn(synchronized=True), 2),
                                             (zoo.mlp(activity_l2=0.01), 3)])
def test_nothing_to_say_when_exact(recwarn, build, replicas):
    strategy = strategy_columns.in_process(replicas)
    _attached_fit(build, strategy)
    assert not [w for w in recwarn if "synchronized" in str(w.message)
                or "activity_regularizer" in str(w.message)]
