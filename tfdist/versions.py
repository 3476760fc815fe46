"""The TensorFlow and Keras versions tfdist supports, and whether this
process runs one of them (``python -m tfdist`` prints it).

One list; ``setup.py``'s pins and the docs' "Supported versions" page
say the same (`tests/test_info.py` keeps the three equal).

>>> from tfdist import versions
>>> versions.TENSORFLOW
('2.19', '2.20', '2.21')
>>> versions.support("tensorflow", "2.20.0"), versions.support("tensorflow", "2.18.1")
('supported', 'not supported: tfdist supports TensorFlow 2.19, 2.20, 2.21')
"""

__all__ = ["KERAS", "TENSORFLOW", "minor", "support"]

# Minor versions whose whole test suite passes (the newest) or whose
# compatibility form does (the others): docs/versions.md.
TENSORFLOW = ("2.19", "2.20", "2.21")
KERAS = ("3.15",)

_NAMES = {"tensorflow": ("TensorFlow", TENSORFLOW), "keras": ("Keras", KERAS)}


def minor(version: str) -> str:
    """``"2.20.0"`` -> ``"2.20"`` (release candidates and local tags too)."""
    return ".".join(version.split("+")[0].split(".")[:2])


def support(package: str, version: str) -> str:
    """"supported", or "not supported: ..." naming the supported minors."""
    name, supported = _NAMES[package]
    if minor(version) in supported:
        return "supported"
    return f"not supported: tfdist supports {name} {', '.join(supported)}"
