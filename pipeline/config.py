"""Settings of `gastric-fl prepare`: frozen dataclasses per concern, loadable from TOML.

The steps they configure follow the FedSAF paper's data processing (paper 001, Sec. 4.2 and Figure 3):
labels from masks, abnormal-region extraction (Step a.1), a random split of slides over hospitals of varying
sizes, cropping into tiles with a white-area filter (Step b) and grayscale conversion for chosen hospitals.
The paper gives no tile size or white threshold; our defaults (128 px tiles, at most 50% near-white) fit the
512x512 SEED slides and are explained in docs/pipeline.md.

Precedence: dataclass defaults < ``--config FILE.toml`` < command-line options. Every value is checked once,
here, with an error that names the value and says how to fix it.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from infra.formats import BINARY_CLASSES
from pipeline.errors import PipelineError
from pipeline.images import DEFAULT_MAX_PIXELS, check_max_pixels
from pipeline.stain_profiles import MAX_STRENGTH, SHIFTS, ListedProfile, parse_listed

Format = Literal["seed", "bot", "class-folders", "idx"]
FORMATS: tuple[str, ...] = ("seed", "bot", "class-folders", "idx")
LABELS: tuple[str, str] = BINARY_CLASSES
# A class folder's name becomes the manifest's label and a folder of the prepared dataset: keep it plain.
CLASS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Partition:
    """How labels are distributed over hospitals: ``iid``, ``dirichlet`` (alpha), ``classes`` (S per client),
    ``abnormal`` (a case mix: each client's share of abnormal slides, ``shares[c]``; binary datasets only), or
    PFLlib's ``pat`` (S classes per client, unbalanced unless ``balanced``) and ``dir`` (alpha), which also make
    the train/test split (`pipeline.pfl_partition`)."""

    kind: Literal["iid", "dirichlet", "classes", "abnormal", "pat", "dir"] = "iid"
    alpha: float = 0.0
    classes: int = 0
    shares: tuple[float, ...] = ()
    balanced: bool = False

    def spec(self) -> str:
        """The command-line spelling, e.g. ``dirichlet:0.5`` or ``abnormal:0.2,0.2,0.8``."""
        if self.kind == "dirichlet":
            return f"dirichlet:{self.alpha:g}"
        if self.kind == "classes":
            return f"classes:{self.classes}"
        if self.kind == "abnormal":
            return "abnormal:" + ",".join(f"{s:g}" for s in self.shares)
        if self.kind == "pat":
            return f"pat{'-balanced' if self.balanced else ''}:{self.classes}"
        if self.kind == "dir":
            return f"dir:{self.alpha:g}"
        return "iid"


@dataclass(frozen=True)
class SourceConfig:
    """Where the raw slides are and how to read them."""

    format: Format = "seed"
    input: Path = Path("data/raw/synthetic")
    mask_suffix: str = "_mask"
    mask_dir: str = "masks"
    # None: a mask must hold 0 and at most one other value; T: pixel > T is cancer, any values accepted.
    mask_threshold: int | None = None
    # class-folders only: the class folders to read, in class-index order; () = every folder with images.
    classes: tuple[str, ...] = ()
    # A slide or mask whose header declares more pixels is skipped undecoded (`pipeline.images.check_pixels`).
    max_pixels: int = DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class SplitConfig:
    """How slides are shared out over hospitals and split into train/val/test (always per slide)."""

    clients: int = 5
    sizes: str = "random"
    partition: Partition = field(default_factory=Partition)
    test_fraction: float = 0.2
    seed: int = 0
    # Share of each hospital's slides in its validation split (thresholds are chosen there; test is only judged).
    val_fraction: float = 0.2


@dataclass(frozen=True)
class TileConfig:
    """How slides are cut into tiles and which tiles are kept."""

    tile: int = 128
    stride: int | None = None
    # None: half the stride. Cancer regions are small, so abnormal slides are tiled with overlap by default.
    abnormal_stride: int | None = None
    # Step a.1 only (mask_outside): an abnormal training tile's white share, counting pixels outside the mask.
    white_max: float = 0.5
    # Step b, every raw tile of either class: at most this share of near-white pixels (glass, not tissue).
    background_max: float = 0.5
    white_level: int = 220
    max_tiles_per_slide: int | None = None
    # A tile of an abnormal slide is abnormal when at least this share of its tissue is inside the mask; tiles
    # below it are left out (counted). Normal tiles come from slides whose mask is empty (`pipeline.tiling`).
    abnormal_coverage: float = 0.5
    # The paper's Step a.1 for *training* tiles of abnormal slides (whitened outside the mask): a departure that
    # writes the label into the pixels; validation and test tiles stay raw whatever this says.
    mask_outside: bool = False


@dataclass(frozen=True)
class HospitalsConfig:
    """Per-hospital heterogeneity: grayscale scanners, scanning resolution, tile size; and each hospital's group
    (``group``: a name per hospital, e.g. hospitals that share a stain, scanner and case mix), which prepare only
    records (``prepare.json``, ``clients[].group``) for analyses that know the simulation's ground truth."""

    grayscale: tuple[int, ...] = ()
    scale: tuple[float, ...] = ()
    tile: tuple[int, ...] = ()
    group: tuple[str, ...] = ()


@dataclass(frozen=True)
class StainShiftConfig:
    """The ``[sites]`` table (a public name): a simulated stain and scanner profile per hospital, applied to its
    tiles (`pipeline.stain_profiles`)."""

    shift: str = "none"
    strength: float = 1.0
    profile: tuple[ListedProfile, ...] = ()


@dataclass(frozen=True)
class OutputConfig:
    """Where the prepared dataset goes and how the run behaves."""

    out: Path = Path("data/prepared/synthetic")
    overwrite: bool = False
    strict: bool = False
    workers: int = 2
    progress: bool = False


@dataclass(frozen=True)
class PrepareConfig:
    """Everything `prepare_dataset` needs, grouped by concern."""

    source: SourceConfig = field(default_factory=SourceConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    tiles: TileConfig = field(default_factory=TileConfig)
    clients: HospitalsConfig = field(default_factory=HospitalsConfig)
    sites: StainShiftConfig = field(default_factory=StainShiftConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_json(self) -> dict[str, Any]:
        """The resolved configuration as JSON-ready sections (paths as given, partition as its spec)."""
        return {
            "source": {
                "format": self.source.format,
                "input": self.source.input.as_posix(),
                "mask_suffix": self.source.mask_suffix,
                "mask_dir": self.source.mask_dir,
                "mask_threshold": self.source.mask_threshold,
                "classes": list(self.source.classes),
                "max_pixels": self.source.max_pixels,
            },
            "split": {
                "clients": self.split.clients,
                "sizes": self.split.sizes,
                "partition": self.split.partition.spec(),
                "test_fraction": self.split.test_fraction,
                "val_fraction": self.split.val_fraction,
                "seed": self.split.seed,
            },
            "tiles": {
                "tile": self.tiles.tile,
                "stride": self.tiles.stride,
                "abnormal_stride": self.tiles.abnormal_stride,
                "white_max": self.tiles.white_max,
                "background_max": self.tiles.background_max,
                "white_level": self.tiles.white_level,
                "max_tiles_per_slide": self.tiles.max_tiles_per_slide,
                "abnormal_coverage": self.tiles.abnormal_coverage,
                "mask_outside": self.tiles.mask_outside,
            },
            "clients": {
                "grayscale": list(self.clients.grayscale),
                "scale": list(self.clients.scale),
                "tile": list(self.clients.tile),
                "group": list(self.clients.group),
            },
            "sites": {
                "shift": self.sites.shift,
                "strength": self.sites.strength,
                "profile": [p.to_json() for p in self.sites.profile],
            },
        }


_SECTIONS: dict[str, type] = {
    "source": SourceConfig,
    "split": SplitConfig,
    "tiles": TileConfig,
    "clients": HospitalsConfig,
    "sites": StainShiftConfig,
    "output": OutputConfig,
}


def parse_partition(spec: str) -> Partition:
    """``iid`` | ``dirichlet:ALPHA`` (ALPHA > 0) | ``classes:S`` (S >= 1; at most the number of classes, which
    `validate_config` and `pipeline.partition` check once the classes are known) | ``abnormal:F0,F1,...`` (each
    client's share of abnormal slides, in [0, 1]; one per client, which `validate_config` checks) | PFLlib's
    ``pat:S`` / ``pat-balanced:S`` (S >= 1 classes per client) and ``dir:ALPHA`` (`pipeline.pfl_partition`)."""
    text = spec.strip().lower()
    if text == "iid":
        return Partition()
    kind, _, value = text.partition(":")
    try:
        if kind == "abnormal":
            shares = tuple(float(part) for part in value.split(","))
            if not shares or any(not (math.isfinite(f) and 0.0 <= f <= 1.0) for f in shares):
                raise ValueError
            return Partition(kind="abnormal", shares=shares)
        if kind == "dirichlet":
            alpha = float(value)
            if not math.isfinite(alpha) or alpha <= 0:
                raise ValueError
            return Partition(kind="dirichlet", alpha=alpha)
        if kind in ("classes", "pat", "pat-balanced"):
            classes = int(value)
            if classes < 1:
                raise ValueError
            if kind == "classes":
                return Partition(kind="classes", classes=classes)
            return Partition(kind="pat", classes=classes, balanced=kind == "pat-balanced")
        if kind == "dir":
            alpha = float(value)
            if not math.isfinite(alpha) or alpha <= 0:
                raise ValueError
            return Partition(kind="dir", alpha=alpha)
    except ValueError:
        pass
    raise PipelineError(
        f"partition {spec!r} is not understood: use iid, dirichlet:ALPHA with ALPHA > 0 (e.g. dirichlet:0.5), "
        "classes:S with S >= 1 (at most the number of classes), or abnormal:F0,F1,... with one share of abnormal "
        "slides in [0, 1] per client (e.g. abnormal:0.2,0.5,0.8), or PFLlib's pat:S, pat-balanced:S or dir:ALPHA"
    )


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """``"0,2"`` -> ``(0, 2)``; an empty string gives ``()``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise PipelineError(f"{name} {text!r} must be comma-separated integers, e.g. 0,2") from None


def parse_float_list(text: str, name: str) -> tuple[float, ...]:
    """``"1,0.5"`` -> ``(1.0, 0.5)``; an empty string gives ``()``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise PipelineError(f"{name} {text!r} must be comma-separated numbers, e.g. 1,0.5,1") from None


def size_ratios(sizes: str, hospitals: int) -> tuple[float, ...] | None:
    """The ratio list of ``--sizes`` (``None`` for ``random``), checked against the number of clients."""
    text = sizes.strip().lower()
    if text == "random":
        return None
    if text == "equal":
        return (1.0,) * hospitals
    ratios = parse_float_list(text, "--sizes")
    if len(ratios) != hospitals or any(not math.isfinite(r) or r <= 0 for r in ratios):
        raise PipelineError(
            f"--sizes {sizes!r} must be 'equal', 'random' or {hospitals} positive numbers (one per client), e.g. "
            + ",".join(str(max(1, hospitals - i)) for i in range(hospitals))
        )
    return ratios


def _coerce(section: str, name: str, value: Any, default: Any) -> Any:
    """Turn a TOML/CLI value into the dataclass field's type, with an error naming ``section.name``."""
    where = f"{section}.{name}"
    if name == "partition":
        if isinstance(value, Partition):
            return value
        if not isinstance(value, str):
            raise PipelineError(f"{where} must be a string such as 'iid', 'dirichlet:0.5' or 'classes:1'")
        return parse_partition(value)
    if name == "profile":
        return parse_listed(value, f"{section}.profile")
    if name == "classes":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise PipelineError(f'{where} must be a list of class folder names, e.g. ["normal", "abnormal"]')
        return tuple(value)
    if name in ("input", "out"):
        if not isinstance(value, str | Path):
            raise PipelineError(f"{where} must be a folder path (a string)")
        return Path(value)
    if section == "clients" and name == "group":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise PipelineError(f'{where} must be a list of group names, one per hospital, e.g. ["A", "A", "B"]')
        return tuple(value)
    if section == "clients":
        kind = float if name == "scale" else int
        if isinstance(value, str):
            return parse_float_list(value, where) if kind is float else parse_int_list(value, where)
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            raise PipelineError(f"{where} must be a list of numbers, e.g. [0, 2]")
        if kind is int and not all(float(v).is_integer() for v in value):
            raise PipelineError(f"{where} must be a list of integers, e.g. [0, 2]")
        return tuple(kind(v) for v in value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise PipelineError(f"{where} must be true or false, not {value!r}")
        return value
    optional = ("stride", "abnormal_stride", "max_tiles_per_slide", "mask_threshold")
    if name in (*optional, "tile", "clients", "seed", "white_level", "workers", "max_pixels"):
        if value is None and name in optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise PipelineError(f"{where} must be an integer, not {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PipelineError(f"{where} must be a number, not {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise PipelineError(f"{where} must be a string, not {value!r}")
        return value
    return value


def build_config(
    toml: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    origin: str = "configuration",
) -> PrepareConfig:
    """Defaults, then the TOML sections, then ``overrides`` (``{section: {field: value}}``; ``None`` values ignored).

    Unknown sections or keys are rejected (a typo must not silently fall back to a default); the result is
    validated with `validate_config`.
    """
    config = PrepareConfig()
    for layer, label in ((toml or {}, origin), (overrides or {}, "command line")):
        for section, values in layer.items():
            if section not in _SECTIONS:
                raise PipelineError(
                    f"{label}: unknown section [{section}]; known sections: {', '.join(sorted(_SECTIONS))}"
                )
            if not isinstance(values, Mapping):
                raise PipelineError(f"{label}: [{section}] must be a table of settings")
            current = getattr(config, section)
            known = {f.name: getattr(current, f.name) for f in fields(current)}
            changes: dict[str, Any] = {}
            for name, value in values.items():
                if name not in known:
                    raise PipelineError(f"{label}: unknown setting {section}.{name}; known: {', '.join(sorted(known))}")
                if value is None and label == "command line":
                    continue
                changes[name] = _coerce(section, name, value, known[name])
            config = replace(config, **{section: replace(current, **changes)})
    validate_config(config)
    return config


def load_toml(path: Path) -> dict[str, Any]:
    """Read a prepare TOML preset; a missing or malformed file is a one-line error naming it."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise PipelineError(f"config file {path} does not exist; pass an existing .toml file to --config") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PipelineError(f"config file {path} could not be read as TOML: {exc}") from None


def validate_config(config: PrepareConfig) -> None:
    """Check every value's range once, before any work starts."""
    src, split, tiles, cl, out = config.source, config.split, config.tiles, config.clients, config.output
    if src.format not in FORMATS:
        raise PipelineError(f"format {src.format!r} is unknown; use one of: {', '.join(FORMATS)}")
    if not src.mask_suffix and not src.mask_dir:
        raise PipelineError("mask_suffix and mask_dir are both empty: give at least one so masks can be found")
    if src.mask_threshold is not None and not 0 <= src.mask_threshold < 65535:
        raise PipelineError(f"--mask-threshold {src.mask_threshold} must be in 0..65534 (pixel > T is cancer)")
    check_max_pixels(src.max_pixels)
    if src.classes:
        if src.format != "class-folders":
            raise PipelineError(
                f"source.classes applies to --format class-folders only (the {src.format} layout's classes are "
                "normal and abnormal); remove it or use --format class-folders"
            )
        bad_names = [c for c in src.classes if not CLASS_NAME.match(c)]
        if bad_names:
            raise PipelineError(
                f"--classes {bad_names[0]!r} is not a usable class folder name: use letters, digits, '.', '_' or "
                "'-' (at most 64, not starting with '.' or '-')"
            )
        if len(set(src.classes)) != len(src.classes):
            raise PipelineError("--classes lists a class twice; give each class folder once")
        if len(src.classes) < 2:
            raise PipelineError(f"--classes {','.join(src.classes)} names one class; a classifier needs at least 2")
    known_classes = (
        len(src.classes) if src.classes else (None if src.format in ("class-folders", "idx") else len(LABELS))
    )
    if (
        split.partition.kind in ("classes", "pat")
        and known_classes is not None
        and split.partition.classes > known_classes
    ):
        raise PipelineError(
            f"partition {split.partition.spec()} asks for more classes per client than the "
            f"{known_classes} the dataset has; use S in 1..{known_classes}"
        )
    if split.clients < 1:
        raise PipelineError(f"--clients {split.clients} must be at least 1")
    if split.partition.kind == "abnormal":
        shares = split.partition.shares
        if len(shares) != split.clients:
            raise PipelineError(
                f"partition {split.partition.spec()} gives {len(shares)} abnormal share(s) but there are "
                f"{split.clients} clients: give one share per client"
            )
        if src.classes and tuple(src.classes) != LABELS:
            raise PipelineError(
                f"partition abnormal:... sets each client's share of abnormal slides, which needs the binary task's "
                f"classes {', '.join(LABELS)} (not {', '.join(src.classes)}); use dirichlet:ALPHA or classes:S"
            )
    size_ratios(split.sizes, split.clients)
    if not 0.0 < split.test_fraction < 1.0:
        raise PipelineError(f"--test-fraction {split.test_fraction} must be between 0 and 1 (exclusive), e.g. 0.2")
    if not 0.0 <= split.val_fraction < 1.0 or split.test_fraction + split.val_fraction >= 1.0:
        raise PipelineError(
            f"--val-fraction {split.val_fraction} must be in [0, 1) and leave slides for training beside "
            f"--test-fraction {split.test_fraction} (their sum below 1), e.g. 0.2; 0 makes no validation split"
        )
    if split.seed < 0:
        raise PipelineError(f"--seed {split.seed} must be a non-negative integer")
    if tiles.tile < 8:
        raise PipelineError(f"--tile {tiles.tile} is too small: use at least 8 pixels (default 128)")
    if tiles.stride is not None and tiles.stride < 1:
        raise PipelineError(f"--stride {tiles.stride} must be a positive number of pixels")
    if tiles.abnormal_stride is not None and tiles.abnormal_stride < 1:
        raise PipelineError(f"--abnormal-stride {tiles.abnormal_stride} must be a positive number of pixels")
    for name, value in (("--white-max", tiles.white_max), ("--background-max", tiles.background_max)):
        if not 0.0 <= value <= 1.0:
            raise PipelineError(f"{name} {value} must be a fraction between 0 and 1")
    if not (math.isfinite(tiles.abnormal_coverage) and 0.0 < tiles.abnormal_coverage <= 1.0):
        raise PipelineError(
            f"--abnormal-coverage {tiles.abnormal_coverage} must be a fraction in (0, 1]: the share of a tile's tissue "
            "that must lie inside the cancer mask for the tile to be labelled abnormal (default 0.5)"
        )
    if not 1 <= tiles.white_level <= 255:
        raise PipelineError(f"--white-level {tiles.white_level} must be in 1..255 (a pixel is near-white at >= it)")
    if tiles.max_tiles_per_slide is not None and tiles.max_tiles_per_slide < 1:
        raise PipelineError(f"--max-tiles-per-slide {tiles.max_tiles_per_slide} must be at least 1")
    bad = [c for c in cl.grayscale if not 0 <= c < split.clients]
    if bad:
        raise PipelineError(
            f"--grayscale-clients {','.join(map(str, bad))}: client indices must be in 0..{split.clients - 1}"
        )
    if len(set(cl.grayscale)) != len(cl.grayscale):
        raise PipelineError("--grayscale-clients lists a hospital twice")
    if cl.scale:
        if len(cl.scale) != split.clients:
            raise PipelineError(
                f"--client-scale has {len(cl.scale)} values but there are {split.clients} clients: give one each"
            )
        if any(not math.isfinite(s) or not 0.05 <= s <= 4.0 for s in cl.scale):
            raise PipelineError("--client-scale values must be between 0.05 and 4 (1 = original resolution)")
    if cl.tile:
        if len(cl.tile) != split.clients:
            raise PipelineError(
                f"--client-tile has {len(cl.tile)} values but there are {split.clients} clients: give one each"
            )
        if any(t < 8 for t in cl.tile):
            raise PipelineError("--client-tile values must be at least 8 pixels")
    if cl.group:
        if len(cl.group) != split.clients:
            raise PipelineError(
                f"--client-group has {len(cl.group)} names but there are {split.clients} clients: give one each"
            )
        bad_groups = [g for g in cl.group if not CLASS_NAME.match(g)]
        if bad_groups:
            raise PipelineError(
                f"--client-group {bad_groups[0]!r} is not a usable group name: use letters, digits, '.', '_' or '-' "
                "(at most 64, not starting with '.' or '-')"
            )
    sites = config.sites
    if sites.shift not in SHIFTS:
        raise PipelineError(f"--site-shift {sites.shift!r} is unknown; use one of: {', '.join(SHIFTS)}")
    if not (math.isfinite(sites.strength) and 0.0 <= sites.strength <= MAX_STRENGTH):
        raise PipelineError(
            f"--site-strength {sites.strength:g} must be between 0 and {MAX_STRENGTH:g} (1 = a typical spread "
            "between laboratories)"
        )
    listed = [p.hospital for p in sites.profile]
    outside = [c for c in listed if c >= split.clients]
    if outside:
        raise PipelineError(
            f"sites.profile lists client {outside[0]}, but client indices are 0..{split.clients - 1}; "
            "fix the client = N line or raise --clients"
        )
    if len(set(listed)) != len(listed):
        raise PipelineError("sites.profile lists a client twice; give one [[sites.profile]] table per hospital")
    if out.workers < 1:
        raise PipelineError(f"--workers {out.workers} must be at least 1")
