"""Every place tfdist relies on a TensorFlow internal that has no public
name, one module per job, behind named functions: `distributed_variables`
(a mirrored variable whose copies live on devices of tfdist's choosing).
`tests/_internal/test_tensorflow_contract.py` pins what they read, so a
TensorFlow upgrade that moves one fails there first, naming the function
to update.

`privates` lists every TensorFlow internal module tfdist imports (and what
it takes from each, and who reads it); the contract test checks each
entry and the architecture test fails on an unlisted import. (Older
modules still import ``tensorflow.python`` where they use it; they move
behind functions here as they are next changed.)
"""
