"""``synthetic_patterns``: tfdist's embedded default dataset, made locally.

A TFDS dataset of 16x16 grayscale images in 10 classes, laid out like MNIST
(``image`` uint8 [16, 16, 1], ``label`` 0-9) so the same input pipeline runs
on both. Each class has a fixed random prototype (smoothed noise); an example
is its prototype shifted by up to 2 pixels, scaled in contrast and covered in
noise. Generation is deterministic (seeded numpy), needs no network,
takes seconds, and writes sharded TFRecord files like any TFDS dataset. A
small MLP learns most of it in 2 epochs (figures:
docs/guides/data.md#the-embedded-dataset).
"""

import numpy as np

from tfdist.data.datasets.tfds_import import tensorflow_datasets

tfds = tensorflow_datasets()

IMAGE_SIZE = 16
NUM_CLASSES = 10
_SPLITS = {"train": (10_000, 1), "test": (2_000, 2)}


def _prototypes(rng: np.random.RandomState) -> np.ndarray:
    noise = rng.rand(NUM_CLASSES, IMAGE_SIZE + 4, IMAGE_SIZE + 4)
    # 3x3 box blur twice: blobs a convnet or an MLP can tell apart.
    for _ in range(2):
        padded = np.pad(noise, ((0, 0), (1, 1), (1, 1)), mode="edge")
        noise = sum(
            padded[:, dy : dy + noise.shape[1], dx : dx + noise.shape[2]]
            for dy in range(3)
            for dx in range(3)
        ) / 9.0
    low = noise.min(axis=(1, 2), keepdims=True)
    high = noise.max(axis=(1, 2), keepdims=True)
    return (noise - low) / (high - low)


def generate_examples(num_examples: int, seed: int):
    """Yields ``(image uint8 [16,16,1], label)`` pairs, deterministically."""
    prototypes = _prototypes(np.random.RandomState(1234))
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, NUM_CLASSES, num_examples)
    shifts = rng.randint(0, 5, (num_examples, 2))
    contrast = rng.uniform(0.6, 1.0, num_examples)
    noise = rng.normal(0.0, 0.25, (num_examples, IMAGE_SIZE, IMAGE_SIZE))
    for i in range(num_examples):
        dy, dx = shifts[i]
        crop = prototypes[labels[i], dy : dy + IMAGE_SIZE, dx : dx + IMAGE_SIZE]
        image = np.clip(crop * contrast[i] + noise[i], 0.0, 1.0)
        yield (np.round(image * 255).astype(np.uint8)[..., None], int(labels[i]))


class SyntheticPatterns(tfds.core.GeneratorBasedBuilder):
    """DatasetBuilder for ``synthetic_patterns`` (see module docstring)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(
                        shape=(IMAGE_SIZE, IMAGE_SIZE, 1)
                    ),
                    "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                }
            ),
            supervised_keys=("image", "label"),
            description=__doc__,
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download.
        return {
            split: self._generate_examples(num_examples, seed)
            for split, (num_examples, seed) in _SPLITS.items()
        }

    def _generate_examples(self, num_examples, seed):
        for index, (image, label) in enumerate(
            generate_examples(num_examples, seed)
        ):
            yield index, {"image": image, "label": label}
