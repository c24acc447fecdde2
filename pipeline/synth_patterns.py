"""The tissue patterns of `gastric-fl synth` and the mixtures that combine them (docs/synthetic-data.md, "Patterns").

A classifier learns from whatever separates its classes. When every carcinoma is darker than everything benign, the
share of dark pixels alone separates them (issue: "dark means cancer"), a model learns that, and on real H&E it calls
every dense tissue abnormal. Real gastric tissue does not work that way: chronic gastritis, lymphoid follicles and
reactive epithelium are dark and benign; poorly cohesive (signet-ring cell) carcinoma is pale; a well-differentiated
tubular adenocarcinoma is no denser than normal mucosa. A pathologist tells them apart by architecture and cytology.
This module names each pattern by its histological basis (WHO Classification of Tumours, Digestive System Tumours,
5th ed., 2019, gastric adenocarcinoma subtypes; the updated Sydney System for gastritis, Dixon et al., Am J Surg
Pathol 1996) as a `Look`: how far each feature departs from normal mucosa. `pipeline.synth_render` paints a `Look`;
`pipeline.synth.render_slide` places patterns on a slide with a `TissueMix`.

Benign (never annotated):

- ``gastritis``: chronic (H. pylori-type) gastritis, a lamina propria packed with lymphocytes and plasma cells
  between intact glands (Sydney System "chronic inflammation"); dark, with normal glands.
- ``follicle``: a lymphoid follicle (aggregate with a germinal centre), common in H. pylori gastritis: a sheet of
  small, round, uniform dark nuclei that displaces the glands; the darkest benign tissue.
- ``reactive``: reactive / regenerative epithelium beside erosion or inflammation: enlarged, hyperchromatic nuclei
  with mucin depletion, but regular architecture and kept polarity, in inflamed stroma.
- ``metaplasia``: intestinal metaplasia, glands whose columnar cells are replaced in part by goblet cells (clear
  mucin vacuoles): paler than normal mucosa, architecture regular.

Malignant (annotated; the mask marks exactly these areas):

- ``intestinal``: moderately differentiated intestinal-type adenocarcinoma (the built-in carcinoma before these
  patterns): crowded, irregular, cribriform or solid glands, stratified, enlarged, hyperchromatic, pleomorphic nuclei,
  amphophilic cytoplasm, desmoplastic stroma; darker than normal mucosa.
- ``tubular``: well-differentiated tubular adenocarcinoma: irregular, branching, fused and cribriform glands
  back to back, elongated stratified nuclei that lose polarity, but normal chromatin and cytoplasm; no darker than
  normal mucosa.
- ``signet_ring``: poorly cohesive carcinoma, signet-ring cell type: single discohesive cells whose mucin vacuole
  pushes a crescent nucleus to the edge, infiltrating the lamina propria and effacing the glands; pale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class Look:
    """How a patch of tissue departs from normal gastric mucosa; each strength in [0, 1] (0 = normal).

    ``arch``: gland crowding, size variation, irregular outlines, broken, cribriform and solid glands.
    ``nuclei``: nuclear size, pleomorphism, stratification, loss of polarity, vesicular chromatin, mitoses.
    ``chroma``: hyperchromasia (nuclear darkness) and coarse chromatin. ``cytoplasm``: amphophilic epithelial
    cytoplasm. ``stroma``: desmoplastic stroma cellularity and stray tumour cells. ``infiltrate``: lymphocytes and
    plasma cells packed into the lamina propria (1 = a solid sheet). ``goblet``: share of epithelial positions taken
    by goblet cells. ``glands``: False where the pattern effaces the glands. ``signet``: density of signet-ring cells.
    """

    arch: float = 0.0
    nuclei: float = 0.0
    chroma: float = 0.0
    cytoplasm: float = 0.0
    stroma: float = 0.0
    infiltrate: float = 0.0
    goblet: float = 0.0
    glands: bool = True
    signet: float = 0.0

    @staticmethod
    def atypia(s: float) -> Look:
        """The built-in carcinoma's atypia of strength ``s``: every feature of the glands at once."""
        return Look(arch=s, nuclei=s, chroma=s, cytoplasm=s, stroma=s)


# Each pattern's look at strength s in [0, 1] (carcinoma: 1 - 0.7 * difficulty; benign: drawn per patch).
PATTERNS: dict[str, Callable[[float], Look]] = {
    # Hyperchromasia and amphophilic cytoplasm fade more slowly than architecture as the carcinoma gets subtler
    # (difficulty), so that darkness neither marks nor unmarks the class at any difficulty.
    "intestinal": lambda s: Look(arch=s, nuclei=s, chroma=0.3 + 0.4 * s, cytoplasm=0.3 + 0.4 * s, stroma=s),
    "tubular": lambda s: Look(arch=s, nuclei=0.6 * s, stroma=0.3 * s),
    "signet_ring": lambda s: Look(chroma=0.3 * s, stroma=0.2 * s, glands=False, signet=0.3 + 0.6 * s),
    "gastritis": lambda s: Look(infiltrate=s),
    "follicle": lambda s: Look(infiltrate=s, glands=False),
    "reactive": lambda s: Look(arch=0.08 * s, nuclei=0.5 * s, chroma=1.2 * s, cytoplasm=0.3 * s, infiltrate=0.3 * s),
    "metaplasia": lambda s: Look(arch=0.05 * s, goblet=0.45 * s),
}
MALIGNANT: tuple[str, ...] = ("intestinal", "tubular", "signet_ring")
BENIGN: tuple[str, ...] = ("gastritis", "follicle", "reactive", "metaplasia")


@dataclass(frozen=True)
class TissueMix:
    """Which patterns a dataset's slides carry, and how often.

    ``intestinal``, ``tubular``, ``signet_ring``: relative weights of an abnormal slide's carcinoma subtype (one per
    region). The benign patterns appear on every slide, normal or abnormal (outside the carcinoma): ``gastritis``,
    ``follicle``, ``reactive`` and ``metaplasia`` are the mean number of patches of each per slide (Poisson;
    chronic gastritis is patchy, multifocal, in the updated Sydney System's mapping).
    """

    intestinal: float = 1.0
    tubular: float = 1.0
    signet_ring: float = 1.0
    gastritis: float = 2.0
    follicle: float = 0.6
    reactive: float = 0.8
    metaplasia: float = 0.8

    def carcinoma_weights(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """The subtypes with a positive weight and their probabilities."""
        pairs = [(name, float(getattr(self, name))) for name in MALIGNANT if getattr(self, name) > 0]
        total = sum(w for _, w in pairs)
        return tuple(n for n, _ in pairs), tuple(w / total for _, w in pairs)

    def as_dict(self) -> dict[str, float]:
        """The mixture as plain numbers (for synth.json)."""
        return {k: float(v) for k, v in asdict(self).items()}


# Named mixtures. "classic": the tissue before these patterns (only intestinal-type carcinoma, no benign look-alikes),
# kept so that earlier datasets and tables can be remade byte for byte; "gastric": the default.
MIXES: dict[str, TissueMix | None] = {"gastric": TissueMix(), "classic": None}
DEFAULT_MIX = "gastric"


def parse_mix(name: str, overrides: str | Mapping[str, float] | None = None) -> TissueMix | None:
    """The mixture ``name`` (`MIXES`) with ``overrides`` ("tubular=2,follicle=0" or a mapping) applied.

    Raises ``ValueError`` with one line naming the bad value. "classic" takes no overrides.
    """
    if name not in MIXES:
        raise ValueError(f"unknown tissue {name!r}: use one of {', '.join(MIXES)} (--tissue)")
    base = MIXES[name]
    if overrides is None or overrides == "" or overrides == {}:
        return base
    if base is None:
        raise ValueError("--mix does not apply to --tissue classic (it has no mixture): use --tissue gastric")
    if isinstance(overrides, str):
        pairs: dict[str, float] = {}
        for item in overrides.split(","):
            key, sep, text = item.partition("=")
            if not sep:
                raise ValueError(f"--mix item {item.strip()!r}: write NAME=WEIGHT, e.g. tubular=2")
            try:
                pairs[key.strip()] = float(text)
            except ValueError:
                raise ValueError(f"--mix {key.strip()}={text.strip()!r}: the weight must be a number") from None
    else:
        pairs = {str(k): float(v) for k, v in overrides.items()}
    known = {f.name for f in fields(TissueMix)}
    for key, value in pairs.items():
        if key not in known:
            raise ValueError(f"--mix {key!r} is not a pattern: use {', '.join(sorted(known))}")
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"--mix {key}={value}: give a finite number >= 0")
    mix = replace(base, **pairs)
    if not any(getattr(mix, name) > 0 for name in MALIGNANT):
        raise ValueError("--mix gives every carcinoma subtype weight 0: keep at least one of " + ", ".join(MALIGNANT))
    return mix
