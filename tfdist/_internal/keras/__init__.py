"""Every place tfdist touches Keras 3 internals, one module per job:
`data_adapters`, `callbacks`, `compiled`, `model_state`, `optimizer`,
`batch_statistics`, `checkpoint_copies`. A Keras upgrade breaks these
small modules only, and `tests/_internal/test_keras_contract.py` pins what they
read. Tested with Keras 3.15.
"""
