"""Every place tfdist relies on a TensorFlow internal that has no public
name, one module per job, behind named functions: `distributed_variables`
(a mirrored variable whose copies live on devices of tfdist's choosing).
`tests/_internal/test_tensorflow_contract.py` pins what they read, so a
TensorFlow upgrade that moves one fails there first, naming the function
to update.

(Older modules still import ``tensorflow.python`` where they use it; they
move here as they are next changed.)
"""
