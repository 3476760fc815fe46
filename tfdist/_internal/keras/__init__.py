"""Every place tfdist touches Keras 3 internals, one module per job:
`data_adapters`, `callbacks`, `callback_files`, `compiled`, `model_state`
(a model's layers and state, the TensorFlow variable behind a Keras
variable), `optimizer` (the optimizer's private state and which optimizers
update elementwise), `patches` (every replacement of a Keras function or
method, on its class or on one object), `batch_statistics`,
`checkpoint_copies`. A private Keras attribute is read, and a Keras
function or method replaced, here only, behind a named function
(`tests/test_architecture.py` fails on one used anywhere else); a Keras
upgrade breaks these small modules only, and
`tests/_internal/test_keras_contract.py` pins what they read, naming the
function to update. Tested with Keras 3.15.
"""
