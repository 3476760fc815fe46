"""Block-style YAML text for the job definitions ``tfdist-run --emit`` prints
(no YAML library needed at run time).

>>> print(to_yaml({"kind": "TrainJob", "spec": {"numNodes": 2, "command": ["python", "a.py"]}}))
kind: "TrainJob"
spec:
  numNodes: 2
  command:
    - "python"
    - "a.py"
"""

import json
from typing import Sequence


def documents(values: Sequence) -> str:
    """Several YAML documents, separated by ``---``, ending in a newline."""
    return "\n---\n".join(to_yaml(value) for value in values) + "\n"


def to_yaml(value, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists, strings, numbers and booleans
    (strings are JSON-quoted, which YAML reads as the same strings)."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict) and item:
                first, *rest = to_yaml(item, indent + 1).split("\n")
                lines.append(f"{pad}- {first.lstrip()}")
                lines.extend(rest)
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (dict, list)):  # empty
        return json.dumps(value)
    return json.dumps(str(value))


