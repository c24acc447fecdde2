"""Labelled images in the IDX format (MNIST, Fashion-MNIST): `gastric-fl prepare --format idx`.

The IDX format is the one LeCun, Cortes and Burges defined for MNIST ("THE MNIST DATABASE of handwritten digits",
section "FILE FORMATS FOR THE MNIST DATABASE") and Zalando's Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017,
arXiv:1708.07747) keeps byte for byte:

- a 4-byte magic number: two zero bytes, one byte naming the element type (``0x08`` unsigned byte, ``0x09``
  signed byte, ``0x0B`` 16-bit, ``0x0C`` 32-bit integer, ``0x0D`` 32-bit float, ``0x0E`` 64-bit float) and one
  byte giving the number of dimensions D;
- D sizes, each a 32-bit big-endian unsigned integer;
- the elements, big-endian, in C (row-major) order: exactly the product of the sizes.

An image set is a pair ``<set>-images-idx3-ubyte`` (N x rows x columns, unsigned bytes) and
``<set>-labels-idx1-ubyte`` (N unsigned bytes), each optionally gzip-compressed (``.gz``), as Debian's package
``dataset-fashion-mnist`` installs them under ``/usr/share/datasets/fashion-mnist/``: ``train`` (60,000) and
``t10k`` (10,000). `image_sets` finds the pairs of a folder, ``train`` first and the others in name order: the
order in which PFLlib's generator merges Fashion-MNIST's training and test images (``generate_FashionMNIST.py``),
which `pipeline.pfl_partition` relies on to reproduce its partition. Parsed with numpy only (``np.frombuffer``
with a big-endian dtype); nothing is downloaded.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pipeline.errors import PipelineError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
# Zalando's class names for Fashion-MNIST's labels 0..9 (its README); prepare names classes by the label value.
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

# element type code -> numpy dtype (big-endian where more than one byte)
_TYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IMAGES = re.compile(r"^(?P<set>.+)-images-idx3-ubyte(?P<gz>\.gz)?$")


class IdxError(PipelineError):
    """An IDX file that cannot be read: missing, truncated, corrupt, or not of the expected shape."""


@dataclass(frozen=True)
class ImageSet:
    """One pair of IDX files: the images (N x rows x columns) and their labels (N)."""

    name: str
    images: Path
    labels: Path


def read_idx(path: Path) -> npt.NDArray[np.generic]:
    """The array an IDX file holds (gzip-compressed when its name ends in ``.gz``), in native byte order.

    Raises `IdxError` naming the file when it is missing, unreadable, not IDX, or holds fewer or more bytes than
    its header declares.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise IdxError(f"{path}: no such IDX file; check --input") from None
    except OSError as exc:
        raise IdxError(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise IdxError(
                f"{path}: not a complete gzip file ({exc}); the file is truncated or damaged, reinstall or re-copy it"
            ) from None
    return parse_idx(raw, str(path))


def parse_idx(raw: bytes, name: str) -> npt.NDArray[np.generic]:
    """Parse the bytes of an (uncompressed) IDX file; ``name`` names it in errors (module docstring)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise IdxError(
            f"{name}: not an IDX file (its magic number is {raw[:4].hex() or 'missing'}; expected 0000 followed by "
            "a type code 08, 09, 0b, 0c, 0d or 0e and the number of dimensions)"
        )
    dims = raw[3]
    header = 4 + 4 * dims
    if dims == 0 or len(raw) < header:
        raise IdxError(f"{name}: IDX header declares {dims} dimension(s) but the file ends inside the header")
    shape = tuple(int(n) for n in np.frombuffer(raw, dtype=">u4", count=dims, offset=4))
    dtype = np.dtype(_TYPES[raw[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise IdxError(
            f"{name}: IDX header declares {'x'.join(map(str, shape))} elements of {dtype.itemsize} byte(s) "
            f"({expected} bytes with the header) but the file holds {len(raw)} bytes; the file is "
            + ("truncated" if len(raw) < expected else "longer than declared")
            + ", reinstall or re-copy it"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=False)


def image_sets(folder: Path) -> list[ImageSet]:
    """The image/label pairs of ``folder``: ``train`` first, then the others by name (``t10k``).

    Raises `IdxError` when the folder is missing or holds no pair, naming the folder and, for Fashion-MNIST, the
    Debian package that installs it; an images file without its labels file is refused by name.
    """
    if not folder.is_dir():
        raise IdxError(
            f"input folder {folder} does not exist; Fashion-MNIST's IDX files are installed by Debian's package "
            f"{FASHION_MNIST_PACKAGE} (apt-get install -y {FASHION_MNIST_PACKAGE}) under {FASHION_MNIST_DIR}"
        )
    sets: list[ImageSet] = []
    for path in sorted(folder.iterdir()):
        match = _IMAGES.match(path.name)
        if match is None or not path.is_file():
            continue
        sets.append(set_of(path))
    if not sets:
        raise IdxError(
            f"input folder {folder} holds no IDX image set (<set>-images-idx3-ubyte[.gz] with "
            f"<set>-labels-idx1-ubyte[.gz]); Fashion-MNIST's are installed by Debian's package "
            f"{FASHION_MNIST_PACKAGE} (apt-get install -y {FASHION_MNIST_PACKAGE}) under {FASHION_MNIST_DIR}"
        )
    return sorted(sets, key=lambda s: (s.name != "train", s.name))


def _stamp(path: Path) -> tuple[str, int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _load_pair(images: tuple[str, int, int], labels: tuple[str, int, int]) -> tuple[np.ndarray, np.ndarray]:
    pixels = read_idx(Path(images[0]))
    values = read_idx(Path(labels[0]))
    if pixels.ndim != 3 or pixels.dtype != np.uint8:
        raise IdxError(
            f"{images[0]}: holds {pixels.dtype} of shape {'x'.join(map(str, pixels.shape))}; an images file must "
            "hold unsigned bytes of shape N x rows x columns"
        )
    if values.ndim != 1 or values.dtype != np.uint8:
        raise IdxError(
            f"{labels[0]}: holds {values.dtype} of shape {'x'.join(map(str, values.shape))}; a labels file must "
            "hold N unsigned bytes"
        )
    if len(values) != len(pixels):
        raise IdxError(
            f"{labels[0]}: {len(values)} labels for the {len(pixels)} images of {images[0]}; use the labels file "
            "of the same set"
        )
    pixels.flags.writeable = False
    values.flags.writeable = False
    return pixels, values


def load_set(image_set: ImageSet) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """The images (N x rows x columns, uint8) and labels (N, uint8) of one pair, read-only; parsed once and kept
    while the files are unchanged (keyed by path, modification time and size)."""
    return _load_pair(_stamp(image_set.images), _stamp(image_set.labels))


def set_of(images: Path) -> ImageSet:
    """The pair an images file belongs to (its labels file beside it), as `image_sets` pairs them."""
    match = _IMAGES.match(images.name)
    if match is None:
        raise IdxError(f"{images}: not named <set>-images-idx3-ubyte[.gz]; rename it as the IDX layout expects")
    name = match.group("set")
    candidates = [images.parent / f"{name}-labels-idx1-ubyte{ext}" for ext in (match.group("gz") or "", ".gz", "")]
    labels = next((c for c in candidates if c.is_file()), None)
    if labels is None:
        raise IdxError(f"{images}: no labels file {name}-labels-idx1-ubyte[.gz] beside it; add it or remove {images}")
    return ImageSet(name=name, images=images, labels=labels)


def idx_bytes(array: npt.NDArray[np.generic]) -> bytes:
    """``array`` as an (uncompressed) IDX file: the inverse of `parse_idx` (module docstring's layout)."""
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _TYPES.items()}
    native = np.dtype(array.dtype).newbyteorder("=")
    if native not in codes or array.ndim < 1 or array.ndim > 255:
        raise IdxError(f"an IDX file cannot hold {array.dtype} of {array.ndim} dimension(s)")
    header = bytes([0, 0, codes[native], array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=np.dtype(_TYPES[codes[native]])).tobytes()


def write_subset(source: Path, out: Path, counts: dict[str, int]) -> list[ImageSet]:
    """The first ``counts[name]`` images (and labels) of each image set of ``source`` written uncompressed to ``out``
    (a new folder), as a smaller IDX dataset in the same merge order; ``source`` is only read."""
    sets = image_sets(source)
    unknown = sorted(set(counts) - {s.name for s in sets})
    if unknown:
        raise IdxError(f"{source} has no image set {unknown[0]!r}; its sets are {', '.join(s.name for s in sets)}")
    out.mkdir(parents=True, exist_ok=False)
    written = []
    for image_set in sets:
        images, labels = load_set(image_set)
        n = counts.get(image_set.name, len(labels))
        if not 0 < n <= len(labels):
            raise IdxError(f"{image_set.name}: {n} images asked for, it holds {len(labels)}; ask for 1..{len(labels)}")
        pair = ImageSet(
            image_set.name,
            out / f"{image_set.name}-images-idx3-ubyte",
            out / f"{image_set.name}-labels-idx1-ubyte",
        )
        pair.images.write_bytes(idx_bytes(images[:n]))
        pair.labels.write_bytes(idx_bytes(labels[:n]))
        written.append(pair)
    return written
