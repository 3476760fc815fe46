"""Plumbing users never import: TensorFlow's log noise, Keras internals,
argument checks, host copies of values, lazy package attributes."""
