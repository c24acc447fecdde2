"""Decode raw slides and masks once into PNG-compatible arrays (FedSAF paper 001, Sec. 4.2, first step).

The paper converts every image to PNG before processing; we decode each format once into RGB ``uint8`` in
memory instead and write only PNG tiles. Variants a scanner or annotation tool may write are normalised:
8/16-bit and float samples, grayscale, RGBA (composited onto white, as a viewer shows it), multi-page TIFF
(the first page, i.e. the full-resolution level). TIFF codecs (deflate, LZW, JPEG, ...) come from
imagecodecs. The decoder is chosen by the file's content (its magic bytes, `image_format`), not by its name:
a TIFF saved as ``.png`` and a PNG saved as ``.tiff`` both decode, and an empty or text file gets one line
naming it. Anything that cannot be decoded raises `ImageReadError`.

Pixel limit: every decoder here first reads the file's header alone (`header_size`: PIL's PNG and JPEG
parsers stop before the pixel data, tifffile reads the first page's tags) and `check_pixels` refuses an image
declaring more than ``max_pixels`` pixels (`DEFAULT_MAX_PIXELS` unless the caller says otherwise) with
`ImageTooLargeError`, before a byte of pixel memory is allocated: a few hundred bytes can declare a
60000 x 60000 image (a decompression bomb). The limit is never above `LIMIT_CEILING`, OpenCV's own decoder cap.
PIL is used for headers only, through its format plugins, so its global decompression-bomb check
(``Image.MAX_IMAGE_PIXELS``) never runs and the user's ``--max-pixels`` is the one limit.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import tifffile
from PIL import JpegImagePlugin, PngImagePlugin

from pipeline.errors import PipelineError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")

RGBImage = npt.NDArray[np.uint8]

# What the command line asks of a file it cannot read (prepare and predict read folders of slides).
REEXPORT = "re-export it or remove it from the input"

# The largest slide `gastric-fl synth` writes is 8192 x 8192 (`pipeline.synth.MAX_SIZE`), 16 times the 2048 x 2048
# SEED and BOT slides; 2**26 pixels accepts exactly that and nothing larger. Measured on 2 CPU cores: predict on an
# 8192 x 8192 PNG takes 14 s and 1.55 GB peak RSS (0.9 GB for a 256 px slide); a 24000 x 24000 upload took 66 s and
# the dashboard from 1.1 to 7.6 GB (issue 23). docs/inference.md, "Pixel limit".
DEFAULT_MAX_PIXELS = 8192 * 8192
# OpenCV's decoders refuse more than 2**30 pixels (CV_IO_MAX_IMAGE_PIXELS) with an assertion: no limit goes above.
LIMIT_CEILING = 1 << 30

# Leading bytes of each accepted format (TIFF: classic and BigTIFF, little- and big-endian).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"),
    (b"MM\x00+", "tiff"),
)


class ImageReadError(PipelineError):
    """A slide or mask file that cannot be decoded (corrupt, truncated, unsupported encoding)."""


class UnreadableImageError(ImageReadError):
    """A file that is not an image this module decodes (empty, another kind of file) or whose data cannot be
    decoded: ``name`` (the file), ``problem`` (what is wrong with it) and ``fix`` (what to do: `REEXPORT`, the
    command line's advice, unless the caller words it for its own users, as the dashboard does with `advising`)."""

    def __init__(self, name: str, problem: str, fix: str = "") -> None:
        self.name, self.problem, self.fix = name, problem, fix or REEXPORT
        super().__init__(f"{name}: {problem}; {self.fix}")

    def __reduce__(self) -> tuple[type[UnreadableImageError], tuple[str, str, str]]:
        return type(self), (self.name, self.problem, self.fix)  # through a process pool with its fields

    def advising(self, fix: str, name: str | None = None) -> UnreadableImageError:
        """The same problem with another ``fix`` (and the file shown as ``name``, if given)."""
        return UnreadableImageError(self.name if name is None else name, self.problem, fix)


class ImageTooLargeError(ImageReadError):
    """An image whose header declares more pixels than the limit (``--max-pixels``); nothing of it was decoded."""


def _decode_tiff(data: bytes) -> npt.NDArray[np.generic]:
    """First page of a TIFF with tifffile (+ imagecodecs: LZW, JPEG, deflate, ... in C).

    No fallback to OpenCV: its libtiff returns a black image for corrupt data instead of failing.
    """
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages.first
        array = np.asarray(page.asarray())
        if page.axes.startswith("S") and array.ndim == 3:
            # Planar (separate-plane) TIFFs come back samples-first.
            array = np.moveaxis(array, 0, -1)
        return array


def _decode_other(data: bytes) -> npt.NDArray[np.generic]:
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if decoded is None:
        raise ValueError("not a decodable PNG/JPEG image")
    if decoded.ndim == 3 and decoded.shape[2] == 3:
        decoded = cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)
    elif decoded.ndim == 3 and decoded.shape[2] == 4:
        decoded = cv2.cvtColor(decoded, cv2.COLOR_BGRA2RGBA)
    return np.asarray(decoded)


def image_format(data: bytes) -> str | None:
    """``"png"``, ``"jpeg"`` or ``"tiff"`` from the file's first bytes; ``None`` for anything else."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    return None


def _format_of(data: bytes, name: str) -> str:
    """The format of ``data`` by content, or `ImageReadError` naming ``name`` (empty file, not an image)."""
    kind = image_format(data)
    if kind is not None:
        return kind
    if not data:
        raise UnreadableImageError(name, "empty file (0 bytes)")
    raise UnreadableImageError(name, f"not a PNG, JPEG or TIFF image ({_content(data)})")


def _content(data: bytes) -> str:
    """What a file that is not an image holds, in words: text, or its first bytes in hex."""
    head = data[:64]
    if all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return "it holds text"
    return f"its first bytes are {head[:4].hex(' ')}"


def _reason(exc: Exception) -> str:
    """A decoder's complaint in one line, without the repr of the in-memory stream (PIL names "<_io.BytesIO object
    ...>") and without OpenCV's assertion text (source file, line and condition mean nothing to the user)."""
    if isinstance(exc, cv2.error):
        return "OpenCV's decoder refused the data"
    text = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(exc))
    return " ".join(text.split()) or type(exc).__name__


def check_max_pixels(max_pixels: int, flag: str = "--max-pixels") -> int:
    """``max_pixels`` if it is a whole number in ``1..LIMIT_CEILING``; else `PipelineError` naming ``flag``."""
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or not 1 <= max_pixels <= LIMIT_CEILING:
        raise PipelineError(
            f"{flag} {max_pixels!r} must be a whole number of pixels from 1 to {LIMIT_CEILING} (2**30, the most "
            f"OpenCV decodes); the default is {DEFAULT_MAX_PIXELS} (8192 x 8192)"
        )
    return max_pixels


def header_size(data: bytes, name: str) -> tuple[int, int]:
    """``(width, height)`` as the file's header declares them, without decoding or allocating any pixel.

    PNG and JPEG: PIL's format plugins, which parse the chunks or markers before the pixel data and stop there
    (called directly rather than through ``Image.open``, whose decompression-bomb check would raise or warn on its
    own fixed limit). TIFF: tifffile's first page, whose tags are all it reads.
    """
    kind = _format_of(data, name)
    try:
        if kind == "tiff":
            with tifffile.TiffFile(io.BytesIO(data)) as tif:
                page = tif.pages.first
                return int(page.imagewidth), int(page.imagelength)
        plugin = PngImagePlugin.PngImageFile if kind == "png" else JpegImagePlugin.JpegImageFile
        with plugin(io.BytesIO(data)) as image:
            width, height = image.size
            return int(width), int(height)
    except Exception as exc:
        raise UnreadableImageError(name, f"cannot decode image ({_reason(exc)})") from None


def check_pixels(
    data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS, hint: str = "downscale it or raise --max-pixels"
) -> tuple[int, int]:
    """The pixel limit, from the header alone (`header_size`): ``(width, height)``, or `ImageTooLargeError`
    naming ``name``, its size, the limit and ``hint`` (what to do) when ``width x height`` exceeds ``max_pixels``.

    Every decoder of this module calls it first; the dashboard calls it on an upload before keeping it.
    """
    width, height = header_size(data, name)
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {width}x{height} is {width * height:,} pixels, more than the limit of {max_pixels:,} pixels; "
            f"{hint}"
        )
    return width, height


def decode_raw(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> npt.NDArray[np.generic]:
    """Decode bytes into an array exactly as stored (any dtype, 2-D or H x W x C, RGB order).

    The header is checked against ``max_pixels`` first (`check_pixels`): a larger image is refused undecoded.
    """
    check_pixels(data, name, max_pixels)
    decode = _decode_tiff if _format_of(data, name) == "tiff" else _decode_other
    try:
        array = decode(data)
    except Exception as exc:
        raise UnreadableImageError(name, f"cannot decode image ({_reason(exc)})") from None
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)) or min(array.shape[:2]) < 1:
        raise ImageReadError(
            f"{name}: unsupported image shape {array.shape}; expected H x W (gray), H x W x 3 (RGB) or H x W x 4"
        )
    return array


def _probe_tiff(data: bytes) -> tuple[int, int]:
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages.first
        samples = int(page.samplesperpixel)
        if samples not in (1, 3, 4):
            raise ValueError(f"{samples} samples per pixel; expected 1 (gray), 3 (RGB) or 4 (RGBA)")
        # Every strip/tile must lie inside the file: catches truncated copies without decoding any pixel.
        for offset, count in zip(page.dataoffsets, page.databytecounts, strict=False):
            if offset + count > len(data):
                raise ValueError("file is truncated (image data runs past its end)")
        return int(page.imagewidth), int(page.imagelength)


def _probe_other(data: bytes) -> tuple[int, int]:
    plugin = PngImagePlugin.PngImageFile if image_format(data) == "png" else JpegImagePlugin.JpegImageFile
    with plugin(io.BytesIO(data)) as image:
        width, height = image.size
        # For PNG this checks every chunk's CRC (truncation, bit rot) without inflating the pixels.
        image.verify()
    return int(width), int(height)


def probe_size(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """``(width, height)`` from the header, with cheap integrity checks; pixels are decoded later, once.

    A large TIFF takes far longer to decode than to tile (benchmarks/prepare_speed.md), so the first pass
    over the slides (before the client split) reads headers only. An image over ``max_pixels`` raises
    `ImageTooLargeError` (`check_pixels`) before the integrity checks.
    """
    check_pixels(data, name, max_pixels)
    probe = _probe_tiff if _format_of(data, name) == "tiff" else _probe_other
    try:
        width, height = probe(data)
    except Exception as exc:
        raise UnreadableImageError(name, f"cannot decode image ({_reason(exc)})") from None
    if width < 1 or height < 1:
        raise ImageReadError(f"{name}: image has no pixels ({width}x{height})")
    return width, height


def to_uint8(array: npt.NDArray[np.generic], name: str) -> npt.NDArray[np.uint8]:
    """Samples to 0..255: 16-bit divided by 257 (65535 -> 255), floats in [0, 1] times 255, bools to 0/255."""
    if array.dtype == np.uint8:
        return np.asarray(array, dtype=np.uint8)
    if array.dtype == np.bool_:
        return np.where(array, np.uint8(255), np.uint8(0))
    if array.dtype == np.uint16:
        return ((array.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if np.issubdtype(array.dtype, np.floating):
        finite = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        if finite.size and (finite.min() < 0.0 or finite.max() > 1.0):
            raise ImageReadError(f"{name}: float samples outside [0, 1]; export the image as 8- or 16-bit")
        return np.rint(finite * 255.0).astype(np.uint8)
    raise ImageReadError(f"{name}: unsupported sample type {array.dtype}; export the image as 8- or 16-bit")


def to_rgb(array: npt.NDArray[np.generic], name: str) -> RGBImage:
    """Any decoded image -> contiguous RGB ``uint8`` (gray replicated; alpha composited onto white)."""
    pixels = to_uint8(array, name)
    if pixels.ndim == 2:
        return np.ascontiguousarray(np.repeat(pixels[:, :, None], 3, axis=2))
    if pixels.shape[2] == 4:
        alpha = pixels[:, :, 3:4].astype(np.uint16)
        # Transparent areas show as white in a viewer, and white is what the pipeline treats as background.
        rgb = (pixels[:, :, :3].astype(np.uint16) * alpha + 255 * (255 - alpha) + 127) // 255
        return np.ascontiguousarray(rgb.astype(np.uint8))
    return np.ascontiguousarray(pixels)


def read_rgb(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> RGBImage:
    """Decode a slide's bytes into RGB ``uint8`` (refused undecoded above ``max_pixels``, `check_pixels`)."""
    return to_rgb(decode_raw(data, name, max_pixels), name)


def read_mask(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> npt.NDArray[np.generic]:
    """Decode a mask's bytes into a 2-D array with its stored values (8- or 16-bit kept as is).

    A colour mask is accepted only if its channels are equal (a gray image saved as RGB); otherwise the
    colours would need an interpretation we cannot guess.
    """
    array = decode_raw(data, name, max_pixels)
    if array.ndim == 3:
        channels = array[:, :, :3]
        if not (
            np.array_equal(channels[:, :, 0], channels[:, :, 1])
            and np.array_equal(channels[:, :, 0], channels[:, :, 2])
        ):
            raise ImageReadError(f"{name}: mask has colour (unequal RGB channels); save it as single-channel 8-bit")
        array = channels[:, :, 0]
    return array


def read_bytes(path: Path) -> bytes:
    """A raw file's bytes (read-only access; raw data is never modified)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ImageReadError(f"{path}: cannot read file ({exc.strerror or exc})") from None


# PNG encoding is most of prepare's CPU time (benchmarks/results/prepare_speed.md). Huffman-only deflate is
# ~15 % faster than OpenCV's default (RLE) on H&E tiles for files 0.5 % larger; levels 1-9 cost 1.5-5x more.
_PNG_PARAMS = [cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY]


def encode_png(tile: npt.NDArray[np.uint8]) -> bytes:
    """RGB (H x W x 3) or gray (H x W) ``uint8`` -> PNG bytes (deterministic: no timestamps)."""
    pixels = cv2.cvtColor(tile, cv2.COLOR_RGB2BGR) if tile.ndim == 3 else tile
    ok, buffer = cv2.imencode(".png", pixels, _PNG_PARAMS)
    if not ok:
        raise PipelineError("PNG encoding failed (OpenCV); check the OpenCV installation")
    return bytes(buffer.tobytes())
