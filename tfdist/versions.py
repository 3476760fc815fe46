"""The TensorFlow and Keras versions tfdist supports, and whether this
process runs one of them (``python -m tfdist`` prints it).

One list; ``setup.py``'s pins and the docs' "Supported versions" page
say the same (`tests/test_info.py` keeps the three equal).

>>> from tfdist import versions
>>> versions.TENSORFLOW
('2.19', '2.20', '2.21', '2.22')
>>> versions.support("tensorflow", "2.20.0"), versions.support("tensorflow", "2.18.1")
('supported', 'not supported: tfdist supports TensorFlow 2.19, 2.20, 2.21, 2.22')
"""

__all__ = ["KERAS", "PAIRS", "TENSORFLOW", "minor", "minor_tuple", "older_than_supported", "pair",
           "support"]

# Minor versions whose whole test suite passes (the newest) or whose
# compatibility form does (the others): docs/versions.md.
TENSORFLOW = ("2.19", "2.20", "2.21", "2.22")
KERAS = ("3.15", "3.16")

# The pairs the suite ran on (TensorFlow minor, the Keras minor pip
# resolves beside it); `pair` says whether this process runs one.
PAIRS = (("2.19", "3.15"), ("2.20", "3.15"), ("2.21", "3.15"), ("2.22", "3.16"))

_NAMES = {"tensorflow": ("TensorFlow", TENSORFLOW), "keras": ("Keras", KERAS)}


def minor(version: str) -> str:
    """``"2.20.0"`` -> ``"2.20"`` (release candidates and local tags too)."""
    return ".".join(version.split("+")[0].split(".")[:2])


def minor_tuple(version: str) -> tuple:
    """``"3.16.0.dev2026102704"`` -> ``(3, 16)``: a version's minor, to compare.

    >>> minor_tuple("3.16.0.dev2026102704") >= (3, 16), minor_tuple("2.22.0rc0")
    (True, (2, 22))
    """
    return tuple(int(part) for part in minor(version).split("."))


def support(package: str, version: str) -> str:
    """"supported", or "not supported: ..." naming the supported minors."""
    name, supported = _NAMES[package]
    if minor(version) in supported:
        return "supported"
    return f"not supported: tfdist supports {name} {', '.join(supported)}"


def older_than_supported(package: str, version: str) -> bool:
    """Whether ``version`` is older than the oldest supported minor.

    >>> older_than_supported("keras", "3.14.1"), older_than_supported("keras", "3.17.0")
    (True, False)
    """
    return minor_tuple(version) < minor_tuple(_NAMES[package][1][0])


def pair(tensorflow: str, keras: str) -> str:
    """"a tested pair", or "not a tested pair: ..." naming the pairs.

    >>> pair("2.22.0rc0", "3.16.0.dev2026102704")
    'a tested pair'
    >>> pair("2.21.0", "3.16.0")
    'not a tested pair: tfdist was tested on TensorFlow 2.19, 2.20, 2.21 with Keras 3.15, 2.22 with Keras 3.16'
    """
    if (minor(tensorflow), minor(keras)) in PAIRS:
        return "a tested pair"
    by_keras = {}
    for tf_minor, keras_minor in PAIRS:
        by_keras.setdefault(keras_minor, []).append(tf_minor)
    named = ", ".join(f"{', '.join(tfs)} with Keras {k}" for k, tfs in by_keras.items())
    return f"not a tested pair: tfdist was tested on TensorFlow {named}"
