"""Every place tfdist touches Keras 3 internals, one module per job:
`data_adapters`, `callbacks`, `callback_files`, `compiled`, `model_state`
(a model's layers and state, the TensorFlow variable behind a Keras
variable), `optimizer` (the optimizer's private state and which optimizers
update elementwise), `patches` (every replacement of a Keras function or
method, on its class or on one object), `batch_statistics`,
`checkpoint_copies`, and `privates` (every private tfdist reads by name and
where each supported Keras keeps it). A private Keras attribute is read,
and a Keras function or method replaced, here only, behind a named function
(`tests/test_architecture.py` fails on one used anywhere else); a Keras
upgrade breaks these small modules only, and
`tests/_internal/test_keras_contract.py` pins what they read, naming the
function to update. Tested with Keras 3.15 and 3.16.

Loading this package checks every private first (`privates.missing`): a
Keras that moved one raises ``tfdist.errors.UnsupportedKerasError`` naming
the Keras version, each private and the supported versions, instead of an
``AttributeError`` from inside a module; a Keras tfdist was not tested with
that has them all runs, with a warning saying so, unless it is older
than the oldest supported (refused: setup.py leaves Keras to TensorFlow's
own requirement, see there).
"""

import warnings

import keras

from tfdist import errors, versions
from tfdist._internal.keras import privates

_gone = privates.missing()
if _gone:
    raise errors.UnsupportedKerasError(privates.report(versions.KERAS, _gone))
if versions.older_than_supported("keras", keras.__version__):
    raise errors.UnsupportedKerasError(
        f"tfdist needs Keras {versions.KERAS[0]} or newer (it supports Keras "
        f"{', '.join(versions.KERAS)}); this is Keras {keras.__version__}: "
        f"pip install 'keras=={versions.KERAS[-1]}.*' (docs/versions.md)")
if versions.minor(keras.__version__) not in versions.KERAS:
    warnings.warn(
        f"tfdist was tested with Keras {', '.join(versions.KERAS)}, not {keras.__version__}: "
        "every Keras internal tfdist reads is where it looks, so it runs, but exactness on this "
        "Keras is untested (docs/versions.md).", RuntimeWarning, stacklevel=2)
del _gone
