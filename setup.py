"""tfdist: exact, strategy-agnostic distributed training for Keras 3 models."""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent

# One version source: tfdist/__init__.py's __version__ (what `python -m tfdist`
# prints), read here as text so that setup.py never imports tfdist.
VERSION = re.search(r'^__version__ = "([^"]+)"$',
                    (HERE / "tfdist" / "__init__.py").read_text(encoding="utf-8"),
                    re.M).group(1)

setup(
    name="tfdist",
    version=VERSION,
    description="Distributed training with tf.distribute that is correct, fast and boring.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
    packages=find_packages(include=["tfdist", "tfdist.*"]),
    python_requires=">=3.10",
    # Support policy (docs/versions.md): the whole suite on TensorFlow 2.21
    # with Keras 3.15 and on 2.22 with Keras 3.16. tfdist reads a few Keras
    # internals (tfdist/_internal/keras/, pinned by a test), hence the named
    # minor versions; a new pair is added once the whole suite passes on it.
    install_requires=[
        "tensorflow>=2.19,<2.23",  # tfdist/versions.py: 2.19, 2.20, 2.21, 2.22
        # Keras comes with TensorFlow (each supported TensorFlow requires
        # Keras 3): TensorFlow's release candidates and nightlies bring it as
        # `keras-nightly`, which pip does not count as `keras`, so naming
        # `keras` here would install a second Keras over theirs. tfdist
        # checks the Keras it finds when it loads (tfdist/versions.py: 3.15,
        # 3.16; an older one, or one whose internals moved, is refused
        # naming what; a newer one whose internals are in place warns).
        "tensorflow-datasets>=4.9.10,<5",
        "importlib_resources",  # tensorflow-datasets needs it, undeclared
        "numpy>=1.26",
        "absl-py>=2.0",
        "tensorboard>=2.19",  # tf.summary writes nothing without it (TensorFlow 2.19 needs 2.19)
    ],
    extras_require={
        # (No matplotlib: Keras imports it whenever it is installed, half a
        # second of CPU in each of the suite's TensorFlow processes; the
        # benchmark's --plot test, in the full form, uses the "plot" extra.)
        "test": ["pytest>=8", "pytest-xdist>=3.5", "psutil>=5.9", "pyyaml>=6", "jsonschema>=4"],
        "plot": ["matplotlib>=3.7"],
        # Engines (issue 15): Ray Train's TensorflowTrainer; Spark barrier
        # stages (needs a Java runtime). Tested: ray 2.60, pyspark 4.3.
        "ray": ["ray[train]>=2.50"],
        "spark": ["pyspark>=3.5"],
        # keras-rs' DistributedEmbedding, its tables looked up by rows or
        # sharded by tfdist on CPUs and GPUs (pure Python; tested: 0.4.0).
        "recommenders": ["keras-rs>=0.4"],
        # The documentation site (mkdocs.yml): `mkdocs build --strict`.
        "docs": ["mkdocs>=1.6", "mkdocs-material", "mkdocstrings[python]"],
    },
    entry_points={
        "console_scripts": [
            "tfdist-prepare-data=tfdist.data.datasets.prepare:main",
            "tfdist-run=tfdist.launch.cli:run",
            "tfdist-info=tfdist.info:main",
        ],
    },
)
