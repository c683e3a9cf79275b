"""One line of a TensorFlow error: the cause, not the ruler, the header or the op's Python traceback."""

import pytest

from tfcluster.core.tferrors import cause, describe, hint, summary

# What TF 2.21 raised for a Saver.save onto a full tmpfs (test_faults_users_hit's full disk), verbatim.
FULL_DISK = ("Graph execution error:\n\nDetected at node 'save/SaveV2' defined at (most recent call last):\n"
             "    File \"/tmp/fullsave.py\", line 4, in <module>\nNode: 'save/SaveV2'\n"
             "/tmp/disk/m-1.data-00000-of-00001.tempstate7995118120812363631; No space left on device\n"
             "\t [[{{node save/SaveV2}}]]\nHint: If you want to see a list of allocated tensors when OOM happens, "
             "add report_tensor_allocations_upon_oom to RunOptions for current allocation info.")


class Raised(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.message = message


def test_the_cause_after_the_ops_traceback_is_the_line():
    assert summary(Raised(FULL_DISK)) == ("/tmp/disk/m-1.data-00000-of-00001.tempstate7995118120812363631; "
                                          "No space left on device")


def test_a_remote_failure_names_the_task_that_failed():
    text = ("From /job:ps/replica:0/task:0:\nVariable v is uninitialized\n\t [[{{node v/read}}]]\n"
            "Additional GRPC error information from remote target /job:ps/replica:0/task:0 while calling /tensorflow")
    assert summary(Raised(text)) == "/job:ps/replica:0/task:0: Variable v is uninitialized"


class FailedOp(Raised):
    def __init__(self, message, op):
        super().__init__(message)
        self.op = type("Op", (), {"name": op})()


@pytest.mark.parametrize("words", ["indices[1] = 12 is not in [0, 10)", "Bad: indices[1] == 12 out of range [0, 10)"])
def test_an_id_outside_its_table_is_named_whichever_op_checked_it_first(words):
    # The gather and the segment sum both check a lookup's ids; the executor runs either first.
    line = cause(FailedOp(f"From /job:worker/replica:0/task:0:\n{words}\n\t [[{{{{node lookup}}}}]]", "id/lookup"))
    assert line == f"id/lookup on worker:0: {words}"
    assert hint(line) == (" (an id is outside its table: a categorical column's num_buckets, hash_bucket_size or "
                          "vocabulary, or a table's rows)")


def test_a_label_check_is_not_taken_for_an_id_outside_its_table():
    assert hint("head/assert: Labels must <= n_classes - 1") == " (a label is outside n_classes)"


@pytest.mark.timeout(120)
def test_a_real_graph_error_reads_as_its_cause(tmp_path):
    tf = pytest.importorskip("tensorflow")
    tf1 = tf.compat.v1
    (tmp_path / "file").write_text("not a directory")
    with tf.Graph().as_default():
        v = tf1.get_variable("v", [4])
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(v.initializer)
            with pytest.raises(tf.errors.OpError) as raised:
                sess.run(saver.saver_def.save_tensor_name,
                         {saver.saver_def.filename_tensor_name: str(tmp_path / "file" / "model")})
    line = describe(raised.value)
    assert "Detected at node" not in line and "File \"" not in line and "\n" not in line
    assert str(tmp_path / "file") in line, line
