"""The MNIST loader: IDX parsing on files written here, the offline split, one clear error when missing."""
import gzip
import os
import struct

import numpy as np
import pytest

from autograder.course.config import load_course
from autograder.course.mnist import MnistMissing, data_source, load_mnist, read_idx


def write_idx(path, array, code=0x08, compress=False):
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype({0x08: np.uint8, 0x0C: ">i4"}[code]).tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trips_images_and_labels(tmp_path, compress):
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28)).astype(np.uint8)
    write_idx(tmp_path / "img", images, compress=compress)
    assert np.array_equal(read_idx(tmp_path / "img"), images)
    ints = np.array([1, -7, 300000], dtype=np.int64)
    write_idx(tmp_path / "ints", ints, code=0x0C)
    assert read_idx(tmp_path / "ints").tolist() == [1, -7, 300000]


def test_read_idx_rejects_a_truncated_file_and_bad_magic(tmp_path):
    write_idx(tmp_path / "img", np.zeros((3, 4, 4), np.uint8))
    raw = (tmp_path / "img").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-5])
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "short")
    (tmp_path / "junk").write_bytes(b"\x89PNG" + raw[4:])
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "junk")


def test_a_full_folder_gives_both_splits(tmp_path):
    rng = np.random.default_rng(1)
    for stem, n in (("train", 30), ("t10k", 12)):
        write_idx(tmp_path / f"{stem}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", rng.integers(0, 10, (n,)), compress=True)
    x, y, xt, yt = load_mnist(n_train=20, n_test=12, folder=tmp_path, download=False)
    assert x.shape == (20, 784) and xt.shape == (12, 784) and y.dtype.is_floating_point is False
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_a_load_is_read_once_per_process_and_each_caller_gets_its_own_copy(tmp_path, monkeypatch):
    """load_mnist reads a folder once (a w8l1 grading loads it about 7 times); writing to what it returned
    changes no later load, and a file replaced on disk is read again."""
    import autograder.course.mnist as mnist
    rng = np.random.default_rng(2)
    for stem, n in (("train", 30), ("t10k", 12)):
        write_idx(tmp_path / f"{stem}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / f"{stem}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    reads = []
    monkeypatch.setattr(mnist, "read_split", lambda *a, real=mnist.read_split: reads.append(a) or real(*a))
    first = load_mnist(n_train=20, n_test=12, folder=tmp_path, download=False)
    kept = first[0].clone()
    first[0].zero_()
    again = load_mnist(n_train=20, n_test=12, folder=tmp_path, download=False)
    assert len(reads) == 2 and np.array_equal(again[0].numpy(), kept.numpy())
    images = rng.integers(0, 256, (30, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte", images)
    stat = (tmp_path / "train-images-idx3-ubyte").stat()  # a later mtime, however coarse the file system's clock
    os.utime(tmp_path / "train-images-idx3-ubyte", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = load_mnist(n_train=20, n_test=12, folder=tmp_path, download=False)
    assert len(reads) == 4 and np.allclose(changed[0].numpy(), images[:20].reshape(20, 784) / 255.0)


def test_missing_data_is_one_error_naming_the_setting(tmp_path):
    with pytest.raises(MnistMissing, match="COURSE_MNIST_DIR"):
        load_mnist(folder=tmp_path / "nowhere", download=False)


def test_the_settings_alone_make_it_missing_as_the_grader_calls_it(tmp_path, monkeypatch):
    """An empty COURSE_MNIST_DIR and the download off: what a fresh clone offline has (a grader failure there)."""
    monkeypatch.setenv("COURSE_MNIST_DIR", str(tmp_path))
    monkeypatch.setenv("COURSE_MNIST_DOWNLOAD", "0")
    assert data_source() == ("missing", tmp_path)
    with pytest.raises(MnistMissing, match="COURSE_MNIST_DIR"):
        load_mnist()


def test_the_offline_test_split_is_split_8000_2000(capsys):
    folder = load_course().mnist_dir
    if not (folder / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no offline MNIST at {folder}")
    x, y, xt, yt = load_mnist(n_train=10000, n_test=2000, folder=folder, download=False)
    assert x.shape == (8000, 784) and xt.shape == (2000, 784)
    assert y[:5].tolist() == [7, 2, 1, 0, 4]            # the test split's well-known first labels
    assert np.bincount(np.concatenate([y.numpy(), yt.numpy()])).tolist() == \
        [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # its published class counts
