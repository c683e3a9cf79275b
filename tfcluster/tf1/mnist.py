"""``tensorflow.examples.tutorials.mnist.input_data`` for TF1 mode, reading local files only.

TF 1.x shipped this module with its tutorials; TF 2 removed it. This is the
same API (``read_data_sets`` returning train/validation/test ``DataSet``
objects with ``next_batch``), reading MNIST or Fashion-MNIST from the four IDX
``.gz`` files in a directory. It never downloads: with no files it says, in one
line, which files to put where.

Differences from TF 1.x, on purpose: shuffling uses the DataSet's own
``numpy.random.RandomState(seed)`` instead of reseeding numpy's global
generator, and ``maybe_download`` raises instead of downloading.
"""

import collections
import gzip
import os

import numpy as np

from ..core.errors import DataError
from ..data.loaders import MNIST_FILES, read_idx

__all__ = ["DataSet", "Datasets", "read_data_sets", "load_mnist", "dense_to_one_hot", "extract_images",
           "extract_labels", "maybe_download", "NUM_CLASSES"]

NUM_CLASSES = 10

#: The classic return type of ``read_data_sets``.
Datasets = collections.namedtuple("Datasets", ["train", "validation", "test"])

_WHERE = ", ".join(f + ".gz" for f in MNIST_FILES.values())


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", None) or np.dtype(dtype).name
    if name not in ("float32", "uint8"):
        raise TypeError(f"Invalid image dtype {dtype!r}, expected uint8 or float32")
    return name


def dense_to_one_hot(labels_dense, num_classes=NUM_CLASSES) -> np.ndarray:
    """Class labels (n,) to one-hot rows (n, num_classes)."""
    labels_dense = np.asarray(labels_dense)
    one_hot = np.zeros((labels_dense.shape[0], num_classes))
    one_hot[np.arange(labels_dense.shape[0]), labels_dense.astype(np.int64)] = 1
    return one_hot


def _read_open_file(f) -> np.ndarray:
    data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    import tempfile
    # read_idx validates the header; give it the bytes through a file.
    with tempfile.NamedTemporaryFile(suffix=".idx") as tmp:
        tmp.write(data)
        tmp.flush()
        return read_idx(tmp.name)


def extract_images(f) -> np.ndarray:
    """Images of an IDX file (path or open binary file) as uint8 (n, rows, cols, 1)."""
    raw = read_idx(f) if isinstance(f, (str, os.PathLike)) else _read_open_file(f)
    if raw.ndim != 3:
        raise DataError(f"{getattr(f, 'name', f)}: expected 3-D IDX images, got shape {raw.shape}")
    return raw.reshape(raw.shape[0], raw.shape[1], raw.shape[2], 1)


def extract_labels(f, one_hot=False, num_classes=NUM_CLASSES) -> np.ndarray:
    """Labels of an IDX file (path or open binary file): uint8 (n,), or one-hot rows."""
    raw = read_idx(f) if isinstance(f, (str, os.PathLike)) else _read_open_file(f)
    if raw.ndim != 1:
        raise DataError(f"{getattr(f, 'name', f)}: expected 1-D IDX labels, got shape {raw.shape}")
    return dense_to_one_hot(raw, num_classes) if one_hot else raw


def maybe_download(filename, work_directory, source_url=None):
    """TF 1.x downloaded here; TF1 mode never downloads, so the file must already exist."""
    path = os.path.join(work_directory, filename)
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist and tfcluster never downloads; put {filename} there")
    return path


class DataSet:
    """One split: ``images``, ``labels``, ``num_examples``, ``epochs_completed``, ``next_batch``."""

    def __init__(self, images, labels, fake_data=False, one_hot=False, dtype="float32", reshape=True,
                 seed=None):
        kind = _dtype_name(dtype)
        self._rng = np.random.RandomState(seed)
        if fake_data:
            self._num_examples = 10000
            self.one_hot = one_hot
        else:
            images, labels = np.asarray(images), np.asarray(labels)
            if images.shape[0] != labels.shape[0]:
                raise ValueError(f"images.shape: {images.shape} labels.shape: {labels.shape}")
            self._num_examples = images.shape[0]
            if reshape:
                if images.ndim == 4 and images.shape[3] != 1:
                    raise ValueError(f"reshape=True needs one channel, got images of shape {images.shape}")
                images = images.reshape(images.shape[0], -1)
            if kind == "float32":
                # Raw IDX pixels are bytes 0..255; TF 1.x scaled them to [0, 1].
                scale = np.issubdtype(images.dtype, np.integer)
                images = images.astype(np.float32)
                if scale:
                    images *= np.float32(1.0 / 255.0)
        self._images = images
        self._labels = labels
        self._epochs_completed = 0
        self._index_in_epoch = 0

    @property
    def images(self):
        """All images of the split (flattened to 784 floats in [0, 1] by default)."""
        return self._images

    @property
    def labels(self):
        """All labels: class numbers, or one-hot rows with ``one_hot=True``."""
        return self._labels

    @property
    def num_examples(self) -> int:
        """How many examples the split holds."""
        return self._num_examples

    @property
    def epochs_completed(self) -> int:
        """Full passes over the split so far."""
        return self._epochs_completed

    def next_batch(self, batch_size, fake_data=False, shuffle=True):
        """The next ``batch_size`` examples; an epoch boundary wraps into a freshly shuffled epoch."""
        if fake_data:
            fake_image = [1.0] * 784
            fake_label = [1] + [0] * 9 if getattr(self, "one_hot", False) else 0
            return [fake_image] * batch_size, [fake_label] * batch_size
        start = self._index_in_epoch
        if self._epochs_completed == 0 and start == 0 and shuffle:
            self._shuffle()
        if start + batch_size > self._num_examples:
            self._epochs_completed += 1
            rest_images = self._images[start:self._num_examples]
            rest_labels = self._labels[start:self._num_examples]
            if shuffle:
                self._shuffle()
            self._index_in_epoch = batch_size - len(rest_images)
            end = self._index_in_epoch
            return (np.concatenate((rest_images, self._images[:end]), axis=0),
                    np.concatenate((rest_labels, self._labels[:end]), axis=0))
        self._index_in_epoch += batch_size
        return self._images[start:self._index_in_epoch], self._labels[start:self._index_in_epoch]

    def _shuffle(self):
        perm = self._rng.permutation(self._num_examples)
        self._images = self._images[perm]
        self._labels = self._labels[perm]


def _find_files(train_dir) -> dict:
    if not train_dir or not os.path.isdir(train_dir):
        raise DataError(f"no MNIST data directory {train_dir!r}: create it and put the four IDX files "
                        f"of MNIST or Fashion-MNIST ({_WHERE}) there; tfcluster never downloads")
    found, missing = {}, []
    for key, stem in MNIST_FILES.items():
        for candidate in (stem + ".gz", stem):
            path = os.path.join(train_dir, candidate)
            if os.path.exists(path):
                found[key] = path
                break
        else:
            missing.append(stem + ".gz")
    if missing:
        which = "no MNIST files" if len(missing) == len(MNIST_FILES) else "missing " + ", ".join(missing)
        raise DataError(f"{which} in {train_dir}: put the four IDX files of MNIST or Fashion-MNIST "
                        f"({_WHERE}) there; tfcluster never downloads")
    return found


def read_data_sets(train_dir, fake_data=False, one_hot=False, dtype="float32", reshape=True,
                   validation_size=5000, seed=None, source_url=None):
    """MNIST or Fashion-MNIST from the IDX files in ``train_dir``: Datasets(train, validation, test)."""
    if fake_data:
        def fake():
            return DataSet([], [], fake_data=True, one_hot=one_hot, dtype=dtype, seed=seed)
        return Datasets(train=fake(), validation=fake(), test=fake())
    files = _find_files(train_dir)
    train_images = extract_images(files["train_images"])
    train_labels = extract_labels(files["train_labels"], one_hot=one_hot)
    test_images = extract_images(files["test_images"])
    test_labels = extract_labels(files["test_labels"], one_hot=one_hot)
    if not 0 <= validation_size <= len(train_images):
        raise ValueError(f"Validation size should be between 0 and {len(train_images)}. "
                         f"Received: {validation_size}.")
    options = dict(dtype=dtype, reshape=reshape, seed=seed)
    validation = DataSet(train_images[:validation_size], train_labels[:validation_size], **options)
    train = DataSet(train_images[validation_size:], train_labels[validation_size:], **options)
    test = DataSet(test_images, test_labels, **options)
    return Datasets(train=train, validation=validation, test=test)


def load_mnist(train_dir="MNIST-data"):
    """``read_data_sets(train_dir)``, as tf.contrib.learn.datasets.mnist.load_mnist was."""
    return read_data_sets(train_dir)
