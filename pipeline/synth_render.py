"""Paint synthetic H&E gastric mucosa, normal or carcinomatous, for `gastric-fl synth`.

Stand-in for the SEED and BOT slides of the FedSAF paper (001, Sec. 4.1, Table 2), which the product never
downloads. The slide is painted as two stain concentration maps, haematoxylin (nuclei, some cytoplasm) and eosin
(stroma, cytoplasm), and turned into RGB with the Beer-Lambert law using Macenko et al.'s reference stain vectors,
the same model stain-normalisation methods invert; this is what makes the colours read as H&E rather than as
pink and purple paint.

Normal mucosa: glands (a ring of columnar epithelium with basal, evenly spaced, elongated nuclei around a pale
lumen) in a fibrous eosinophilic stroma with scattered lymphocytes, plasma cells and spindle cells, white
background and tears. Inside a *zone* of atypia strength ``s`` (1 = frank carcinoma) glands become crowded,
irregular, broken, cribriform or solid, epithelium stratifies, and nuclei grow larger, rounder, pleomorphic,
hyperchromatic and lose their polarity. Weak zones (small ``s``) imitate reactive atypia on normal slides.

`render_tissue` composes the parts: the random fields and point sets (`pipeline.synth_fields`), the glands, nuclei
and vessels (`pipeline.synth_cells`) and the stain model that turns them into RGB (`pipeline.synth_stain`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.synth_cells import (
    _draw_glands,
    _draw_nuclei,
    _gland_nuclei,
    _make_glands,
    _Nuclei,
    _signet_cells,
    _stroma_nuclei,
    _vessels,
)
from pipeline.synth_fields import U8, Bool, _fibres, _smooth, _tissue
from pipeline.synth_patterns import Look
from pipeline.synth_stain import Palette, _compose


@dataclass(frozen=True)
class Zone:
    """An area that departs from normal mucosa: ``mask`` (bool, slide-sized) and strength ``s`` in [0, 1].

    ``look`` None: the built-in atypia of strength ``s`` (`Look.atypia`); else the pattern's own look
    (`pipeline.synth_patterns`).
    """

    mask: Bool
    s: float
    look: Look | None = None

    @property
    def appearance(self) -> Look:
        """What the zone looks like."""
        return Look.atypia(self.s) if self.look is None else self.look


def render_tissue(
    rng: np.random.Generator,
    size: int,
    unit: float,
    zones: list[Zone],
    palette: Palette,
    aggregates: int = 0,
    fill: bool = True,
) -> U8:
    """An RGB ``size`` x ``size`` H&E image; ``unit`` is the radius of a normal epithelial nucleus in pixels.

    ``fill``: zones are solid tissue (no tears or ragged edge inside them), as the built-in carcinoma always was;
    False lets tears and the tissue's edge cross them like any other tissue, so that a zone is not marked by
    having no glass (`pipeline.synth_patterns`).
    """
    tissue = _tissue(rng, size, unit, cover=float(rng.uniform(0.86, 0.98)))
    zone_any = np.zeros((size, size), bool)
    # Per-pixel strength of the features that act outside the glands: stroma, cytoplasm, chromatin, infiltrate.
    maps = {k: np.zeros((size, size), np.float32) for k in ("stroma", "cytoplasm", "chroma", "infiltrate")}
    for zone in zones:
        zone_any |= zone.mask
        look = zone.appearance
        for key, strength in maps.items():
            strength[zone.mask] = np.maximum(strength[zone.mask], getattr(look, key))
    if fill:
        # Tumour fills its region: no background holes where carcinoma was annotated.
        tissue = np.maximum(tissue, zone_any.astype(np.float32))
    fib = _fibres(rng, size, unit)

    # Glands: normal mucosa everywhere, then each zone's atypical glands composited inside the zone only, so
    # carcinoma stops exactly at the annotated outline (normal glands crossing it appear cut, as in invasion).
    sections = [(1.0, 1.5), (1.6, 2.8)]
    elongation = sections[int(rng.random() < 0.35)]
    epi = np.zeros((size, size), np.uint8)
    lumen = np.zeros((size, size), np.uint8)
    nuc = np.zeros((size, size), np.uint8)
    normal_nuclei = _Nuclei()
    normal_glands = _make_glands(rng, size, unit, tissue > 0.5, Look(), elongation)
    _draw_glands(normal_glands, epi, lumen)
    for g in normal_glands:
        _gland_nuclei(rng, g, unit, normal_nuclei)
    _draw_nuclei(rng, nuc, normal_nuclei)
    for zone in zones:
        look = zone.appearance
        if look.glands and not (look.arch or look.nuclei or look.chroma or look.goblet or look.signet):
            continue  # the normal glands already drawn are this zone's (e.g. gastritis changes only the stroma)
        z_epi = np.zeros_like(epi)
        z_lumen = np.zeros_like(lumen)
        z_nuc = np.zeros_like(nuc)
        z_nuclei = _Nuclei()
        # Centres may lie a gland's radius outside the zone: glands straddling the outline are clipped by the
        # composite below, so gland density does not dip along the boundary.
        reach = _smooth(zone.mask.astype(np.float32), 4.0 * unit) > 0.02
        glands = _make_glands(rng, size, unit, reach, look, elongation) if look.glands else []
        _draw_glands(glands, z_epi, z_lumen)
        for g in glands:
            _gland_nuclei(rng, g, unit, z_nuclei)
        if look.signet > 0:
            _signet_cells(rng, size, unit, reach, look.signet, z_lumen, z_nuclei)
        _draw_nuclei(rng, z_nuc, z_nuclei)
        epi[zone.mask] = z_epi[zone.mask]
        lumen[zone.mask] = z_lumen[zone.mask]
        nuc[zone.mask] = z_nuc[zone.mask]

    free = (epi < 64) & (lumen < 64) & (tissue > 0.5)
    rbc = np.zeros((size, size), np.uint8)
    _vessels(rng, size, unit, free, lumen, rbc)
    free &= lumen < 64
    stroma_nuclei = _Nuclei()
    infiltrate = _smooth(maps["infiltrate"], 2.0 * unit) if maps["infiltrate"].any() else None
    _stroma_nuclei(rng, size, unit, free, maps["stroma"], aggregates, stroma_nuclei, infiltrate)
    _draw_nuclei(rng, nuc, stroma_nuclei)
    return _compose(rng, size, unit, tissue, fib, epi, lumen, nuc, rbc, maps["cytoplasm"], maps["chroma"], palette)
