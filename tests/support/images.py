"""Helpers shared by the pipeline tests (and, for the bomb files, by tests/inference and tests/app)."""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by its path relative to ``root`` (forward slashes)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width x height`` RGB pixels but which holds a few bytes of data.

    The shape of a decompression bomb: the header alone says how much memory decoding would take. IHDR, one
    small IDAT (a valid zlib stream, far too short for the declared size) and IEND, each with a correct CRC.
    """

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, deflate, no filter, no interlace
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def bomb_tiff(width: int, height: int) -> bytes:
    """A little-endian TIFF whose first page declares ``width x height`` 8-bit RGB pixels in one deflate strip of a
    few bytes: a file of about 150 bytes that asks for ``3 x width x height`` bytes when decoded."""
    data = zlib.compress(b"\0" * 64)
    entries = 10
    bits_at = 8 + 2 + entries * 12 + 4
    data_at = bits_at + 6
    tags = [
        (256, 4, 1, width),  # ImageWidth
        (257, 4, 1, height),  # ImageLength
        (258, 3, 3, bits_at),  # BitsPerSample 8,8,8 (stored after the IFD)
        (259, 3, 1, 8),  # Compression: deflate
        (262, 3, 1, 2),  # Photometric: RGB
        (273, 4, 1, data_at),  # StripOffsets
        (277, 3, 1, 3),  # SamplesPerPixel
        (278, 4, 1, height),  # RowsPerStrip: one strip
        (279, 4, 1, len(data)),  # StripByteCounts
        (284, 3, 1, 1),  # PlanarConfiguration: contiguous
    ]
    ifd = struct.pack("<H", entries)
    for tag, kind, count, value in tags:
        packed = struct.pack("<HI", value, 0)[:4] if kind == 3 else struct.pack("<I", value)
        ifd += struct.pack("<HHI", tag, kind, count) + packed
    ifd += struct.pack("<I", 0)
    return b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<HHH", 8, 8, 8) + data
