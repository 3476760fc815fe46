"""tfdist: exact, strategy-agnostic distributed training for Keras 3 models."""

from setuptools import find_packages, setup

setup(
    name="tfdist",
    version="0.1.0",
    description="Distributed training with tf.distribute that is correct, fast and boring.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfdist", "tfdist.*"]),
    python_requires=">=3.10",
    # Tested: TensorFlow 2.21 with Keras 3.15. tfdist reads a few Keras
    # internals (tfdist/_internal/keras_internals.py), hence the narrow Keras range.
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "keras>=3.15,<3.16",
        "tensorflow-datasets>=4.9.10,<5",
        "importlib_resources",  # tensorflow-datasets needs it, undeclared
        "numpy>=1.26",
        "absl-py>=2.0",
        "tensorboard>=2.20",  # tf.summary writes nothing without it
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3.5", "psutil>=5.9", "matplotlib>=3.7", "pyyaml>=6"],
        "plot": ["matplotlib>=3.7"],
        # Engines (issue 15): Ray Train's TensorflowTrainer; Spark barrier
        # stages (needs a Java runtime). Tested: ray 2.60, pyspark 4.3.
        "ray": ["ray[train]>=2.50"],
        "spark": ["pyspark>=3.5"],
    },
    entry_points={
        "console_scripts": [
            "tfdist-prepare-data=tfdist.data.datasets.prepare:main",
            "tfdist-run=tfdist.launch.cli:run",
            "tfdist-info=tfdist.info:main",
        ],
    },
)
