"""The public API as text: one line per public name, with its signature.

Every name reached from ``tfdist.__all__`` (into the subpackages' own
``__all__``) is listed: functions with their signatures, classes with their
constructor, public methods, properties and (for records) fields, and other
values by type. The listing is checked in (``tests/public_api.txt``) and a
test diffs it against the code, so an API change is a deliberate edit of
that file, with its CHANGELOG line.

    python3 -m tests.support.api_listing           # prints the listing
    python3 -m tests.support.api_listing --write   # rewrites tests/public_api.txt

>>> lines = listing()
>>> any(line.startswith("tfdist.attach(model, strategy=None, *, checkpointing=None")
...     for line in lines)
True
"""

import dataclasses
import enum
import importlib
import inspect
import pathlib
import re
import sys

LISTING = pathlib.Path(__file__).resolve().parents[1] / "public_api.txt"


def _signature(function) -> str:
    try:
        text = str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"
    # Default values that print their address (objects, functions) vary per
    # run, and Keras' and TensorFlow's module paths per version: a type
    # annotation from keras.src / tensorflow.python is shown by its name.
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    return re.sub(r"\b(?:keras\.src|tensorflow\.python)(?:\.\w+)*\.(\w+)", r"\1", text)


def _class_lines(path: str, cls) -> list:
    lines = [f"class {path}{_signature(cls)}"]
    if issubclass(cls, BaseException):
        return lines
    if issubclass(cls, enum.Enum):
        return lines + [f"  {path}.{member.name} = {member.value!r}" for member in cls]
    if dataclasses.is_dataclass(cls):
        lines += [f"  field {field.name}: {getattr(field.type, '__name__', field.type)}"
                  for field in dataclasses.fields(cls)]
    for name, value in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            lines.append(f"  property {path}.{name}")
        elif isinstance(value, (staticmethod, classmethod)):
            kind = type(value).__name__
            lines.append(f"  {kind} {path}.{name}{_signature(value.__func__)}")
        elif inspect.isfunction(value):
            lines.append(f"  {path}.{name}{_signature(value)}")
        elif not inspect.isclass(value) and not (dataclasses.is_dataclass(cls)
                                                 and name in cls.__dataclass_fields__):
            lines.append(f"  {path}.{name}: {type(value).__name__}")
    return lines


def _lines_for(path: str, value) -> list:
    if inspect.isclass(value):
        return _class_lines(path, value)
    if callable(value):
        return [f"{path}{_signature(value)}"]
    return [f"{path}: {type(value).__name__}"]


def listing(root: str = "tfdist") -> list:
    """The listing's lines, sorted by public path."""
    found = {}

    def walk(module_name):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value):
                if value.__name__.startswith(root + ".") and value.__name__ != module_name:
                    walk(value.__name__)
                continue
            found[f"{module_name}.{name}"] = value

    walk(root)
    lines = []
    for path in sorted(found):
        lines += _lines_for(path, found[path])
    return lines


def main(argv) -> int:
    text = "\n".join(listing()) + "\n"
    if "--write" in argv:
        LISTING.write_text(text, encoding="utf-8")
        print(f"wrote {LISTING} ({text.count(chr(10))} lines)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
