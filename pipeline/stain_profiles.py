"""Simulated stain profiles: a per-hospital stain and scanner profile applied to the tiles `prepare` writes.

Real multi-site histopathology differs by laboratory and scanner: the haematoxylin and eosin batches and
staining times (stain colour and strength), the scanner's illumination, optics (focus blur) and file
compression. Models trained at one site lose accuracy at another for exactly these reasons, and stain
augmentation (Tellez et al., 2019) perturbs the same quantities. A *stain profile* describes one hospital:

- ``hue`` (degrees): both stain vectors (and the residual) rotated about the gray axis in optical-density
  space, i.e. the stains' colour changes while their darkness does not. Gray pixels stay gray.
- ``stain_h``, ``stain_e``: gains on the haematoxylin and eosin concentrations, found by colour deconvolution
  (Ruifrok and Johnston, 2001) with Macenko et al.'s reference stain vectors, the ones `gastric-fl synth`
  paints with.
- ``brightness``: gain on the transmitted light (the scanner's exposure); 1 leaves it unchanged.
- ``blur``: Gaussian blur, sigma in output tile pixels (focus); 0 = none.
- ``jpeg``: JPEG quality 1..100 of a compress-decompress round trip (OpenCV, 4:2:0 chroma); 0 = lossless.

Order, as in a scanner: stain (the glass slide), light, optics, then a grayscale scanner's conversion to one
channel, then compression. Every step is a fixed function of the pixels, so the same tile and profile always
give the same bytes. Profiles are either listed per hospital or drawn (``shift = "random"``) from a generator
keyed by ``(split.seed, hospital)``, so a hospital's profile does not depend on the number of hospitals.
The raw slides are never touched: the shift exists only in the prepared tiles.

The public names keep the word "site": the ``[sites]`` table of a prepare preset (``shift``, ``strength``,
``[[sites.profile]]``), ``prepare --site-shift/--site-strength``, ``clients[].site`` in ``prepare.json`` and the
report's ``site`` column. In code a *site* is a hospital's installation (`federation.hospital.handler.Site`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from pipeline.errors import PipelineError

# Macenko et al. (2009) reference stain vectors (RGB optical density of unit concentration); the residual
# completes the basis (Ruifrok and Johnston's third vector).
_H = np.array([0.5626, 0.7201, 0.4062])
_E = np.array([0.2159, 0.8012, 0.5581])
_R = np.cross(_H, _E) / np.linalg.norm(np.cross(_H, _E))
STAIN_MATRIX = np.stack([_H / np.linalg.norm(_H), _E / np.linalg.norm(_E), _R])  # rows: H, E, residual
_DECONVOLVE = np.linalg.inv(STAIN_MATRIX)
SHIFTS: tuple[str, ...] = ("none", "random")
# Keeps the profile generator's stream apart from every other draw made from split.seed.
_PROFILE_STREAM = 0x5173
MAX_STRENGTH = 2.0


@dataclass(frozen=True)
class StainProfile:
    """One hospital's simulated stain and scanner (module docstring); the defaults change nothing."""

    hue: float = 0.0
    stain_h: float = 1.0
    stain_e: float = 1.0
    brightness: float = 1.0
    blur: float = 0.0
    jpeg: int = 0

    @property
    def is_identity(self) -> bool:
        """Whether applying the profile leaves every tile as it is."""
        return self == StainProfile()

    @property
    def changes_colour(self) -> bool:
        """Whether the stain step (hue or stain gains) does anything."""
        return self.hue != 0.0 or self.stain_h != 1.0 or self.stain_e != 1.0

    def to_json(self) -> dict[str, float | int]:
        """The profile as written to ``prepare.json``."""
        return asdict(self)

    def describe(self) -> list[str]:
        """Two short lines for the contact sheet, e.g. ``["hue +8 H 1.20 E 0.85", "light 0.95 blur 0.6 q70"]``."""
        return [
            f"hue {round(self.hue) or 0:+d} H {self.stain_h:.2f} E {self.stain_e:.2f}",
            f"light {self.brightness:.2f} blur {self.blur:.1f}" + (f" q{self.jpeg}" if self.jpeg else ""),
        ]


_LIMITS: dict[str, tuple[float, float]] = {
    "hue": (-180.0, 180.0),
    "stain_h": (0.05, 5.0),
    "stain_e": (0.05, 5.0),
    "brightness": (0.1, 4.0),
    "blur": (0.0, 20.0),
    "jpeg": (0.0, 100.0),
}
PROFILE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StainProfile))


def check_profile_value(name: str, value: Any, where: str) -> float | int:
    """One profile field checked and converted; an error names ``where`` and the allowed range."""
    low, high = _LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PipelineError(f"{where} must be a number in [{low:g}, {high:g}], not {value!r}")
    if name == "jpeg":
        if not float(value).is_integer() or not 0 <= value <= 100:
            raise PipelineError(f"{where} must be a whole JPEG quality 1..100, or 0 for lossless; got {value!r}")
        return int(value)
    if not low <= value <= high:
        raise PipelineError(f"{where} {value!r} is outside [{low:g}, {high:g}]; pick a value in that range")
    return float(value)


@dataclass(frozen=True)
class ListedProfile:
    """A hospital's profile values given in the configuration (``[[sites.profile]]``), over the drawn ones."""

    hospital: int
    values: tuple[tuple[str, float | int], ...]

    def to_json(self) -> dict[str, float | int]:
        """``{"client": c, field: value, ...}`` as in the TOML table."""
        return {"client": self.hospital, **dict(self.values)}


def parse_listed(tables: Any, where: str) -> tuple[ListedProfile, ...]:
    """``[[sites.profile]]`` tables -> `ListedProfile`s; unknown fields, bad values, a missing client are errors."""
    if isinstance(tables, Mapping):
        tables = [tables]
    if not isinstance(tables, list | tuple):
        raise PipelineError(f"{where} must be a list of tables such as [[sites.profile]] client = 0 hue = 8")
    listed = []
    for k, table in enumerate(tables):
        if isinstance(table, ListedProfile):
            listed.append(table)
            continue
        at = f"{where}[{k}]"
        if not isinstance(table, Mapping):
            raise PipelineError(f"{at} must be a table with client = N and profile values")
        hospital = table.get("client")
        if isinstance(hospital, bool) or not isinstance(hospital, int) or hospital < 0:
            raise PipelineError(f"{at}.client must be a hospital index >= 0, not {hospital!r}")
        values = []
        for name, value in table.items():
            if name == "client":
                continue
            if name not in PROFILE_FIELDS:
                raise PipelineError(f"{at}: unknown profile value {name!r}; known: {', '.join(PROFILE_FIELDS)}")
            values.append((name, check_profile_value(name, value, f"{at}.{name}")))
        listed.append(ListedProfile(hospital, tuple(values)))
    return tuple(listed)


def draw_profile(seed: int, hospital: int, strength: float) -> StainProfile:
    """Hospital ``hospital``'s random profile at ``strength`` (0 = none; 1 = a typical spread between labs).

    At strength 1: hue uniform in +-12 degrees; stain gains and brightness log-uniform in e^+-0.35 (0.70-1.42)
    and e^+-0.12 (0.89-1.13); blur sigma uniform in [0, 1.5] px; JPEG quality uniform in 40..95. Departures
    scale with the strength; values are rounded (3 decimals) and the rounded values are the ones applied.
    """
    if strength == 0:
        return StainProfile()
    rng = np.random.default_rng([seed, _PROFILE_STREAM, hospital])
    u = rng.uniform(-1.0, 1.0, size=4)
    blur, quality = rng.uniform(0.0, 1.0, size=2)
    return StainProfile(
        hue=round(12.0 * strength * float(u[0]), 3),
        stain_h=round(math.exp(0.35 * strength * float(u[1])), 3),
        stain_e=round(math.exp(0.35 * strength * float(u[2])), 3),
        brightness=round(math.exp(0.12 * strength * float(u[3])), 3),
        blur=round(1.5 * strength * float(blur), 3),
        jpeg=max(5, round(95 - 55 * strength * float(quality))),
    )


def stain_profiles_for(
    shift: str, strength: float, listed: Sequence[ListedProfile], seed: int, hospitals: int
) -> list[StainProfile | None]:
    """Every hospital's profile (``None`` where the tiles are left as they are)."""
    by_hospital = {entry.hospital: dict(entry.values) for entry in listed}
    out: list[StainProfile | None] = []
    for hospital in range(hospitals):
        base = draw_profile(seed, hospital, strength) if shift == "random" else StainProfile()
        profile = replace(base, **by_hospital.get(hospital, {}))  # type: ignore[arg-type]
        out.append(None if profile.is_identity else profile)
    return out


def _rotation(degrees: float) -> npt.NDArray[np.float64]:
    """Rotation by ``degrees`` about the gray axis (1, 1, 1) / sqrt(3) (Rodrigues' formula)."""
    axis = np.ones(3) / math.sqrt(3.0)
    theta = math.radians(degrees)
    cross = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) * math.cos(theta) + math.sin(theta) * cross + (1 - math.cos(theta)) * np.outer(axis, axis)


def optical_density(rgb: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """Beer-Lambert optical density ``-ln((I + 1) / 256)`` per channel (white 255 -> 0)."""
    return np.asarray(-np.log((rgb.astype(np.float32) + 1.0) / 256.0), dtype=np.float32)


def stain_concentrations(rgb: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """H, E and residual concentrations of every pixel (H x W x 3) by colour deconvolution."""
    return np.asarray(optical_density(rgb) @ _DECONVOLVE.astype(np.float32), dtype=np.float32)


def _stain(rgb: npt.NDArray[np.uint8], profile: StainProfile) -> npt.NDArray[np.float32]:
    """Transmitted light (0..255, float) after the stain step and the light gain."""
    od = optical_density(rgb)
    if profile.changes_colour:
        # Concentrations scaled, then recomposed with the profile's stain vectors (the reference ones rotated).
        gains = np.diag([profile.stain_h, profile.stain_e, 1.0])
        matrix = _DECONVOLVE @ gains @ STAIN_MATRIX @ _rotation(profile.hue).T
        od = od @ matrix.astype(np.float32)
    light = np.exp(-od) * np.float32(256.0) - np.float32(1.0)
    if profile.brightness != 1.0:
        light *= np.float32(profile.brightness)
    return np.asarray(light, dtype=np.float32)


def apply_stain_profile(rgb: npt.NDArray[np.uint8], profile: StainProfile, grayscale: bool) -> npt.NDArray[np.uint8]:
    """An RGB tile as hospital ``profile`` would have scanned it: RGB, or single-channel for a gray scanner."""
    if profile.changes_colour or profile.brightness != 1.0:
        pixels = np.asarray(np.clip(np.rint(_stain(rgb, profile)), 0, 255), dtype=np.uint8)
    else:
        pixels = rgb
    if profile.blur > 0:
        pixels = np.asarray(cv2.GaussianBlur(pixels, (0, 0), profile.blur), dtype=np.uint8)
    out = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY) if grayscale else np.ascontiguousarray(pixels)
    if profile.jpeg:
        encoded = out if grayscale else cv2.cvtColor(out, cv2.COLOR_RGB2BGR)
        ok, buffer = cv2.imencode(".jpg", encoded, [cv2.IMWRITE_JPEG_QUALITY, profile.jpeg])
        if not ok:
            raise PipelineError("JPEG encoding failed (OpenCV); check the OpenCV installation")
        decoded = cv2.imdecode(buffer, cv2.IMREAD_GRAYSCALE if grayscale else cv2.IMREAD_COLOR)
        if decoded is None:
            raise PipelineError("JPEG decoding failed (OpenCV); check the OpenCV installation")
        out = decoded if grayscale else cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)
    return np.asarray(out, dtype=np.uint8)
