"""Whether traced code wrote a variable or drew stateful random numbers:
what makes running the same code a second time differ from the first;
or ran a check or a print, which a second run in the backward pass
could wait on forever.

Fully sharded weights free a layer's gathered weights after its forward
pass and compute the forward pass again in the backward pass
(`tfdist.communication.gather_units`). That is exact only when the
second pass does what the first did: a layer that updates a variable
(``BatchNormalization``'s moving statistics, a Keras ``SeedGenerator``
drawing a ``Dropout`` mask) or draws from TensorFlow's stateful random
ops would update or draw again. A stateful op that reads no variable (a
``tf.debugging.assert_*``, ``tf.print``) is run by TensorFlow after the
one traced before it, whichever replica traced that: MirroredStrategy
traces replica 0's step, backward pass included, before replica 1's, so
such an op in a recomputed forward pass (replica 0's backward) would make
replica 1's forward pass wait for replica 0's backward pass, which waits
for replica 1's gathers: a deadlock. `Writes` looks at the ops a piece of
traced code added, and at the functions it added (a ``tf.while_loop``'s
body, a branch), for such ops.

TensorFlow has no public listing of the functions a graph holds:
``Graph._functions`` (name -> function) is what its own ``while_loop``
adds to; `tests/_internal/test_state_writes.py` pins it.

>>> import tensorflow as tf
>>> found = {}
>>> counter = tf.Variable(0)
>>> @tf.function
... def traced(x):
...     writes = Writes(tf.compat.v1.get_default_graph())
...     y = x * 2
...     found["pure"] = writes.found()
...     counter.assign_add(1)
...     found["counting"] = writes.found()
...     return y
>>> _ = traced(tf.constant(1.0))
>>> found["pure"], found["counting"]
([], ['AssignAddVariableOp'])
"""

from typing import List

import tensorflow as tf

# Op types that change state another run would see changed, or draw new
# random numbers each time they run.
_WRITE_PREFIXES = ("Assign", "ResourceScatter", "ResourceApply", "ResourceStridedSliceAssign",
                   "Random", "StatefulRandom", "StatefulUniform", "StatefulStandardNormal",
                   "StatefulTruncatedNormal", "RngSkip", "RngReadAndSkip")
_WRITE_TYPES = {"TruncatedNormal", "Multinomial", "ParameterizedTruncatedNormal"}
# Stateful ops that read no variable: TensorFlow runs them in the order traced.
_ORDERED_TYPES = {"Assert", "Print", "PrintV2", "CheckNumerics", "CheckNumericsV2"}


def _writes(op_type: str) -> bool:
    return (op_type.startswith(_WRITE_PREFIXES) or op_type in _WRITE_TYPES
            or op_type in _ORDERED_TYPES)


class Writes:
    """The ops and functions ``graph`` gains from now on; `found` lists
    the op types among them that write state or draw random numbers."""

    def __init__(self, graph: tf.Graph):
        self._graph = graph
        self._ops = len(graph.get_operations())
        self._functions = set(self._function_names())

    def _function_names(self):
        return getattr(self._graph, "_functions", {}).keys()

    def found(self) -> List[str]:
        types = [op.type for op in self._graph.get_operations()[self._ops:]]
        functions = getattr(self._graph, "_functions", {})
        for name in set(self._function_names()) - self._functions:
            definition = getattr(functions[name], "definition", None)
            if definition is not None:
                types.extend(node.op for node in definition.node_def)
        return sorted({op_type for op_type in types if _writes(op_type)})
