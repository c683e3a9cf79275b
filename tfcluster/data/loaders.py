"""Real data for examples and tests, with no downloads, and the loaders for real files.

- ``load_digits()``: the UCI handwritten digits (1,797 8x8 images) that ship
  inside scikit-learn's wheel; read straight from the file, so it is fast and
  needs no network.
- ``load_mnist(path)``: MNIST or Fashion-MNIST from the four IDX ``.gz`` files
  in a directory, or from a Keras-style ``.npz``, for people who have them.
- ``shard`` and ``to_dataset``: each worker's slice, as a ``tf.data`` pipeline.

Every loader returns a :class:`DataSet` of float32 images in [0, 1] with shape
``(n, height, width, 1)`` and int32 labels.
"""

import gzip
import importlib.util
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..core.errors import DataError

#: File names of MNIST and Fashion-MNIST (the same four in both data sets).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B,
              np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


@dataclass(frozen=True)
class DataSet:
    """Train and test arrays of one data set, images in [0, 1] as (n, h, w, 1)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int = 10

    @property
    def image_shape(self) -> tuple:
        """Shape of one image, e.g. (28, 28, 1)."""
        return tuple(self.x_train.shape[1:])

    def flat(self) -> "DataSet":
        """The same data with each image flattened to a vector (for MLPs)."""
        return DataSet(self.name, self.x_train.reshape(len(self.x_train), -1),
                       self.y_train, self.x_test.reshape(len(self.x_test), -1), self.y_test,
                       self.num_classes)


# ------------------------------------------------------------------- shipped
def _sklearn_data_file(name: str) -> str:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits data ships with scikit-learn, which is not installed: "
                        "pip install 'tfcluster[examples]' (or scikit-learn)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", name)
    if not os.path.exists(path):
        raise DataError(f"scikit-learn is installed but has no {name} at {path}")
    return path


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> DataSet:
    """The UCI handwritten digits shipped in scikit-learn, split into train and test."""
    raw = np.loadtxt(_sklearn_data_file("digits.csv.gz"), delimiter=",", dtype=np.float32)
    images = (raw[:, :-1] / 16.0).reshape(-1, 8, 8, 1).astype(np.float32)
    labels = raw[:, -1].astype(np.int32)
    # A fixed shuffle so every worker and every run sees the same split.
    order = np.random.RandomState(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    n_test = int(round(len(labels) * test_fraction))
    return DataSet("digits", images[n_test:], labels[n_test:], images[:n_test], labels[:n_test])


# ---------------------------------------------------------------------- IDX
def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw), the format of MNIST and Fashion-MNIST."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = np.dtype(_IDX_TYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    count = int(np.prod(shape)) if shape else 1
    if len(data) - header != count * dtype.itemsize:
        raise DataError(f"{path}: IDX header says shape {shape}, but the file holds "
                        f"{(len(data) - header) // dtype.itemsize} values")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def write_idx(path: str, array: np.ndarray):
    """Write an array as an IDX file (gzip-compressed when ``path`` ends in .gz)."""
    array = np.asarray(array)
    dtype = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    code = _IDX_CODES.get(np.dtype(dtype))
    if code is None:
        raise DataError(f"IDX cannot store dtype {array.dtype}")
    payload = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload += array.astype(dtype).tobytes()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(payload)


def _find(directory: str, stem: str) -> str:
    for candidate in (stem + ".gz", stem, stem.replace("-idx", ".idx") + ".gz", stem.replace("-idx", ".idx")):
        p = os.path.join(directory, candidate)
        if os.path.exists(p):
            return p
    raise DataError(f"{directory} has no {stem}.gz; put the four MNIST/Fashion-MNIST IDX files "
                    f"({', '.join(f + '.gz' for f in MNIST_FILES.values())}) there")


def _images(raw: np.ndarray) -> np.ndarray:
    x = raw.astype(np.float32)
    if raw.dtype == np.uint8:
        x /= 255.0
    return x.reshape(raw.shape[0], raw.shape[1], raw.shape[2] if raw.ndim > 2 else 1, 1)


def load_mnist(path: str) -> DataSet:
    """MNIST or Fashion-MNIST from a directory of IDX files, or from a Keras-style .npz."""
    if path.endswith(".npz"):
        try:
            with np.load(path) as z:
                parts = {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        except KeyError as e:
            raise DataError(f"{path} lacks array {e}; expected x_train, y_train, x_test, y_test") from None
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path}: {e}") from None
        return DataSet(os.path.basename(path)[:-4], _images(parts["x_train"]), parts["y_train"].astype(np.int32),
                       _images(parts["x_test"]), parts["y_test"].astype(np.int32))
    if not os.path.isdir(path):
        raise DataError(f"no data at {path}: give a directory of IDX files or an .npz file")
    arrays = {k: read_idx(_find(path, stem)) for k, stem in MNIST_FILES.items()}
    for split in ("train", "test"):
        n_img, n_lab = len(arrays[f"{split}_images"]), len(arrays[f"{split}_labels"])
        if n_img != n_lab:
            raise DataError(f"{path}: {n_img} {split} images but {n_lab} labels")
    return DataSet(os.path.basename(os.path.normpath(path)), _images(arrays["train_images"]),
                   arrays["train_labels"].astype(np.int32), _images(arrays["test_images"]),
                   arrays["test_labels"].astype(np.int32))


def load(source: str = "digits") -> DataSet:
    """``"digits"`` for the shipped data set, else a path for :func:`load_mnist`."""
    return load_digits() if source == "digits" else load_mnist(source)


# ------------------------------------------------------------------ sharding
def shard(x: np.ndarray, y: np.ndarray, num_shards: int, index: int) -> tuple:
    """Worker ``index``'s disjoint slice (every ``num_shards``-th example)."""
    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} out of range for {num_shards} shard(s)")
    return x[index::num_shards], y[index::num_shards]


def to_dataset(x: np.ndarray, y: np.ndarray, batch_size: int, num_shards: int = 1, index: int = 0,
               shuffle: bool = True, repeat: bool = True, seed: int = 0):
    """A ``tf.data`` pipeline over this shard: shuffled, repeated, batched, prefetched."""
    import tensorflow as tf
    xs, ys = shard(x, y, num_shards, index)
    ds = tf.data.Dataset.from_tensor_slices((xs, ys))
    if shuffle:
        ds = ds.shuffle(len(xs), seed=seed + index, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    # drop_remainder keeps every step's batch the size the loss is scaled by.
    return ds.batch(batch_size, drop_remainder=repeat).prefetch(2)
