"""MNIST as tensors: torchvision's download when it works, else the standard IDX files in a folder.

torch is imported by load_mnist alone: which MNIST is used (data_source, describe_source) is said without it.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autograder.errors import SetupProblem

if TYPE_CHECKING:
    import torch

SETTING = "COURSE_MNIST_DIR"  # environment variable; course.yaml's data.mnist_dir is the default
IDX_DTYPES: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
SPLITS = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
Split = tuple[Any, Any]  # (images uint8 (N, 28, 28), labels (N,)) as numpy arrays


class MnistMissing(SetupProblem, FileNotFoundError):
    """No MNIST could be found: the message names the setting to fix."""


def read_idx(path: str | Path) -> np.ndarray:
    """One IDX file (optionally gzipped) as a numpy array: magic, dims, then big-endian data."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip, whatever the file is called
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic bytes {raw[:4].hex()})")
    dtype, ndim = np.dtype(IDX_DTYPES[raw[2]]), raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    body = raw[4 + 4 * ndim:]
    if len(body) != int(np.prod(dims)) * dtype.itemsize:
        raise ValueError(f"{path}: header says {dims} x {dtype.itemsize} bytes, file has {len(body)} bytes of data")
    return np.frombuffer(body, dtype=dtype).reshape(dims)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


def read_split(folder: Path, split: str) -> Split | None:
    """(images uint8 (N, 28, 28), labels uint8 (N,)) of one split in `folder`, or None if absent."""
    found = [_find(folder, stem) for stem in SPLITS[split]]
    paths = [p for p in found if p is not None]
    if len(paths) < len(found):
        return None
    images, labels = (read_idx(p) for p in paths)
    if len(images) != len(labels):
        raise ValueError(f"{folder}: {len(images)} images but {len(labels)} labels in the {split} split")
    return images, labels


def mnist_dir(default: str | Path | None = None) -> Path:
    """The configured IDX folder: $COURSE_MNIST_DIR, else course.yaml's data.mnist_dir."""
    if os.environ.get(SETTING):
        return Path(os.environ[SETTING])
    if default is not None:
        return Path(default)
    from autograder.course.config import load_course
    return load_course().mnist_dir


def _torchvision(root: Path) -> tuple[Split, Split] | None:
    """Both splits through torchvision's downloader, or None when it cannot fetch them."""
    try:
        from torchvision.datasets import MNIST
        train, test = (MNIST(root, train=t, download=True) for t in (True, False))
    except Exception:  # offline, blocked, or torchvision missing: the IDX folder is the fallback
        return None
    return (train.data.numpy(), train.targets.numpy()), (test.data.numpy(), test.targets.numpy())


def download_wanted(download: bool | None = None) -> bool:
    """Whether torchvision's download may be tried: data.mnist_download in course.yaml, unless
    COURSE_MNIST_DOWNLOAD=0."""
    if download is None:
        download = os.environ.get("COURSE_MNIST_DOWNLOAD", "1") != "0" and _download_allowed()
    return download


def data_source(folder: str | Path | None = None, download: bool | None = None) -> tuple[str, Path]:
    """(kind, folder): which images load_mnist uses ('idx', 'download' or 'test split'; 'missing' if none)."""
    folder = mnist_dir(folder)
    download = download_wanted(download)
    have = {s for s, stems in SPLITS.items() if folder.is_dir() and all(_find(folder, st) for st in stems)}
    if have == set(SPLITS):
        return "idx", folder
    if download and _torchvision_once() is not None:
        return "download", folder
    return ("test split" if "test" in have else "missing"), folder


Loaded = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor"]  # X_train, y_train, X_test, y_test
_loaded: dict[tuple, Loaded] = {}  # read once per process (a w8l1 grading reads it about 7 times)


def load_mnist(n_train: int = 10000, n_test: int = 2000, folder: str | Path | None = None,
               download: bool | None = None) -> Loaded:
    """(X_train, y_train, X_test, y_test): float32 (N, 784) in [0, 1] and int64 labels, on the CPU.

    Read once per process for each source, size and file version; every call gets its own copies, which the
    caller may change."""
    kind, folder = data_source(folder, download)
    key = (kind, str(Path(folder).resolve()), n_train, n_test, _versions(folder) if kind != "download" else ())
    if key not in _loaded:
        _loaded.clear()  # one source at a time: a changed folder or file replaces it
        _loaded[key] = _read_mnist(kind, folder, n_train, n_test, download)
    return tuple(t.clone() for t in _loaded[key])  # type: ignore[return-value]


def _versions(folder: Path) -> tuple:
    """(name, size, mtime) of the IDX files in `folder`: a file replaced on disk is read again."""
    found = [_find(folder, stem) for stems in SPLITS.values() for stem in stems]
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in found if p is not None)


def _read_mnist(kind: str, folder: Path, n_train: int, n_test: int, download: bool | None) -> Loaded:
    """load_mnist's reading and conversion, for the source data_source found."""
    splits: Any
    if kind == "idx":
        splits = read_split(folder, "train"), read_split(folder, "test")
    elif kind == "download":
        splits = _torchvision_once()
    elif kind == "test split":
        splits = _split_test_only(read_split(folder, "test"), folder)  # type: ignore[arg-type]  # found by data_source
    else:
        raise MnistMissing(missing_message(folder, download_wanted(download)))
    (images_train, labels_train), (images_test, labels_test) = splits
    import torch

    def as_x(a: Any, n: int) -> torch.Tensor:  # (n, 784) in [0, 1]
        return torch.from_numpy(np.asarray(a[:n], dtype=np.float32).reshape(len(a[:n]), 784) / 255.0)

    def as_y(a: Any, n: int) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a[:n], dtype=np.int64))

    return (as_x(images_train, n_train), as_y(labels_train, n_train),
            as_x(images_test, n_test), as_y(labels_test, n_test))


_download_result: list[tuple[Split, Split] | None] = []


def _torchvision_once() -> tuple[Split, Split] | None:
    """Try the download once per process: offline, every later call goes straight to the folder."""
    if not _download_result:
        _download_result.append(_torchvision(download_root()))
    return _download_result[0]


def download_root() -> Path:
    """Where torchvision's download is kept ($COURSE_MNIST_CACHE)."""
    return Path(os.environ.get("COURSE_MNIST_CACHE", Path.home() / ".cache" / "course-mnist"))


def source_files(kind: str, folder: Path) -> list[Path]:
    """The IDX files load_mnist reads for a source (data_source's kind and folder), in a fixed order: both splits'
    for a folder or the download (torchvision keeps its files in MNIST/raw), the test split's alone for the test
    split, none when missing."""
    if kind == "download":
        folder = download_root() / "MNIST" / "raw"
    splits = {"idx": ("train", "test"), "download": ("train", "test"), "test split": ("test",)}.get(kind, ())
    found = [_find(folder, stem) for split in splits for stem in SPLITS[split]]
    return [path for path in found if path is not None]


def _split_test_only(test: Split, folder: Path) -> tuple[Split, Split]:
    """Only the 10,000-image test split: its first 8,000 train, its last 2,000 test (describe_source says so)."""
    images, labels = test
    return (images[:8000], labels[:8000]), (images[-2000:], labels[-2000:])


def _download_allowed() -> bool:
    try:
        from autograder.course.config import load_course
        return load_course().mnist_download
    except Exception:
        return False


def configured_by() -> str:
    """The setting that chose the IDX folder, as a person would change it."""
    return f"${SETTING}" if os.environ.get(SETTING) else "data.mnist_dir in course.yaml"


def missing_message(folder: Path, download: bool) -> str:
    """What failed, why, and the settings that fix it, in one line."""
    tried = "the download failed (no network?)" if download else "the download is off (data.mnist_download)"
    return (f"MNIST not found: no IDX files (t10k-images-idx3-ubyte[.gz], ...) in {folder} ({configured_by()}) "
            f"and {tried}; set {SETTING} or data.mnist_dir in course.yaml to a folder holding them (the course's "
            f"data/mnist has the test split)")


def describe_source(folder: str | Path | None = None, download: bool | None = None) -> str | None:
    """One line for a person: which MNIST grading uses, where it is, and the setting that chose it; None when
    there is none (missing_message says why)."""
    kind, folder = data_source(folder, download)
    if kind == "idx":
        return f"MNIST: both splits' IDX files in {folder} ({configured_by()})"
    if kind == "download":
        return "MNIST: torchvision's download of both splits (data.mnist_download in course.yaml)"
    if kind == "test split":
        return (f"MNIST: the 10,000-image test split in {folder} ({configured_by()}): its first 8,000 images "
                f"train, its last 2,000 test")
    return None
