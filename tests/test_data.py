"""Data: the shipped digits load offline, real MNIST-format files load from disk, pipelines run without
tf.data's autotune thread unless the program chose it."""

import gzip
import json
import os

import numpy as np
import pytest

from tfcluster import data


def test_shipped_digits_load_without_network_as_images_in_unit_range():
    d = data.load_digits()
    assert d.x_train.shape[1:] == (8, 8, 1) and d.x_train.dtype == np.float32
    assert len(d.x_train) + len(d.x_test) == 1797
    assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    assert set(np.unique(d.y_train)) == set(range(10))


def test_digits_split_is_the_same_in_every_process():
    a, b = data.load_digits(), data.load_digits()
    assert np.array_equal(a.y_test, b.y_test)


def _write_mnist(directory, n_train=6, n_test=4, size=28):
    rng = np.random.RandomState(1)
    arrays = {
        "train_images": rng.randint(0, 256, (n_train, size, size)).astype(np.uint8),
        "train_labels": rng.randint(0, 10, n_train).astype(np.uint8),
        "test_images": rng.randint(0, 256, (n_test, size, size)).astype(np.uint8),
        "test_labels": rng.randint(0, 10, n_test).astype(np.uint8),
    }
    for key, stem in data.MNIST_FILES.items():
        data.write_idx(str(directory / (stem + ".gz")), arrays[key])
    return arrays


def test_idx_files_in_a_directory_load_as_mnist(tmp_path):
    arrays = _write_mnist(tmp_path)
    d = data.load_mnist(str(tmp_path))
    assert d.x_train.shape == (6, 28, 28, 1) and d.x_test.shape == (4, 28, 28, 1)
    assert np.allclose(d.x_train[..., 0] * 255.0, arrays["train_images"])
    assert np.array_equal(d.y_test, arrays["test_labels"])


def test_keras_style_npz_loads(tmp_path):
    rng = np.random.RandomState(0)
    path = tmp_path / "fashion.npz"
    np.savez(path, x_train=rng.randint(0, 256, (5, 28, 28)).astype(np.uint8), y_train=np.arange(5),
             x_test=rng.randint(0, 256, (3, 28, 28)).astype(np.uint8), y_test=np.arange(3))
    d = data.load(str(path))
    assert d.x_train.shape == (5, 28, 28, 1) and list(d.y_test) == [0, 1, 2]


def test_idx_round_trips_wider_types(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    data.write_idx(str(tmp_path / "a.idx"), a)
    assert np.array_equal(data.read_idx(str(tmp_path / "a.idx")), a)


@pytest.mark.parametrize("content, words", [
    (b"\x00\x00\x08", "bad magic"),
    (b"\x01\x02\x08\x01\x00\x00\x00\x02", "bad magic"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "holds 2 values"),
])
def test_a_corrupt_idx_file_is_refused_with_its_name(tmp_path, content, words):
    p = tmp_path / "bad-idx1-ubyte.gz"
    with gzip.open(p, "wb") as f:
        f.write(content)
    with pytest.raises(data.DataError, match=words) as e:
        data.read_idx(str(p))
    assert str(p) in str(e.value)


def test_a_directory_without_the_files_says_where_to_put_them(tmp_path):
    with pytest.raises(data.DataError, match="train-images-idx3-ubyte.gz"):
        data.load_mnist(str(tmp_path))


def test_shards_are_disjoint_and_cover_the_data():
    x, y = np.arange(10), np.arange(10)
    parts = [data.shard(x, y, 3, i)[0] for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
    with pytest.raises(ValueError):
        data.shard(x, y, 3, 3)


@pytest.mark.timeout(60)
def test_big_arrays_an_input_fn_gives_tf_data_stay_out_of_the_graph_and_read_the_same():
    import tensorflow as tf

    from tfcluster.graph.model import InputContext, make_dataset
    tf1 = tf.compat.v1
    x = np.arange(1024 * 512, dtype=np.float32).reshape(1024, 512)     # 2 MB: kept out
    y = np.arange(1024, dtype=np.int64)                                  # 8 KB: a constant, as before
    with tf.Graph().as_default() as g:
        ds = make_dataset(lambda ctx: tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(1000),
                          InputContext())
        n = tf.data.experimental.cardinality(ds)
        it = tf1.data.make_initializable_iterator(ds)
        batch = it.get_next()
        assert len(g.as_graph_def().SerializeToString()) < (1 << 20)
        with tf1.Session() as s:
            s.run(it.initializer)
            first = s.run(batch)
            assert s.run(n) == 2
    np.testing.assert_array_equal(first["x"], x[:1000])
    np.testing.assert_array_equal(first["y"], y[:1000])
    assert batch["x"].shape.as_list() == [None, 512]
    # Outside make_dataset, tf.data is TensorFlow's own again.
    with tf.Graph().as_default() as g:
        tf.data.Dataset.from_tensor_slices(x)
        assert len(g.as_graph_def().SerializeToString()) > (2 << 20)


# ------------------------------------------------------------------ tf.data's autotune thread
def autotune_choices(graph):
    """Each ``with_options`` dataset's autotune choice in ``graph``, in the order they were made (None: unset)."""
    from tensorflow.core.framework import dataset_options_pb2
    out = []
    for op in graph.get_operations():
        if op.type == "OptionsDataset":
            options = dataset_options_pb2.Options()
            options.ParseFromString(op.get_attr("serialized_options"))
            out.append(options.autotune_options.enabled if options.autotune_options.HasField("enabled") else None)
    return out


def _dataset(explicit=None):
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((64, 4), np.float32), np.zeros(64, np.int64)))
    if explicit is not None:
        options = tf.data.Options()
        options.autotune.enabled = explicit
        ds = ds.with_options(options)
    return ds


@pytest.mark.parametrize("explicit", [None, True, False], ids=["unset", "on by the program", "off by the program"])
def test_a_pipeline_runs_without_the_autotune_thread_unless_the_program_chose(explicit):
    import tensorflow as tf

    from tfcluster.data import without_autotune_thread
    with tf.Graph().as_default() as g:
        without_autotune_thread(_dataset(explicit))
        assert autotune_choices(g) == ([False] if explicit is None else [explicit])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("explicit", [None, True], ids=["unset", "on by the program"])
def test_fit_and_the_estimator_read_input_without_the_autotune_thread_unless_the_program_chose(explicit, tmp_path):
    import tensorflow as tf

    import tfcluster
    from tfcluster.estimator.calls import call_input_fn
    from tfcluster.strategies import ModelOutput
    tf1 = tf.compat.v1
    graphs = []

    class Capture(tfcluster.Hook):
        def begin(self):
            graphs.append(tf1.get_default_graph())

    def model_fn(features, labels, mode):
        logits = tf.matmul(features, tf1.get_variable("w", [4, 2]))
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return ModelOutput(predictions=tf.argmax(logits, 1), per_example_loss=loss)
    tfcluster.fit(model_fn, lambda ctx: _dataset(explicit).batch(ctx.per_replica_batch), steps=2, batch_size=8,
                  optimizer=lambda: tf1.train.GradientDescentOptimizer(0.1), hooks=[Capture()], log_every_secs=60,
                  summary_steps=None)
    assert autotune_choices(graphs[0])[-1] is (False if explicit is None else True)
    with tf.Graph().as_default() as g:
        call_input_fn(lambda: _dataset(explicit).batch(8), "train", {}, None, "/cpu:0")
        assert autotune_choices(g)[-1] is (False if explicit is None else True)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tf1_scripts_own_iterators_run_without_the_autotune_thread_unless_it_chose(tmp_path):
    import subprocess
    import sys

    from conftest import base_env
    script = tmp_path / "iterators.py"
    script.write_text(
        "import json, tensorflow as tf\n"
        "from test_data import autotune_choices\n"
        "plain = tf.data.Dataset.range(4)\n"
        "plain.make_one_shot_iterator(); tf.data.make_initializable_iterator(plain)\n"
        "options = tf.data.Options(); options.autotune.enabled = True\n"
        "tf.data.make_one_shot_iterator(plain.with_options(options))\n"
        "print('CHOICES', json.dumps(autotune_choices(tf.get_default_graph())))\n")
    env = base_env(PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                               base_env().get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf1", str(script)], env=env, capture_output=True, text=True,
                       timeout=100)
    assert r.returncode == 0, r.stderr[-3000:]
    choices = json.loads(r.stdout.split("CHOICES ", 1)[1])
    # One off for each of the first two iterators; the third keeps the script's own choice, untouched.
    assert choices == [False, False, True]
