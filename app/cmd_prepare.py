"""`gastric-fl prepare`: raw SEED/BOT/class-folder slides -> per-hospital tile datasets (FedSAF paper 001, Sec. 4.2).

A thin shell over `pipeline.prepare.prepare_dataset`: options are collected into the ``PrepareConfig``
sections (defaults < ``--config FILE.toml`` < options given here) and the report is printed. SIGTERM and
SIGHUP stop it like Ctrl-C: the half-written folder is removed and one line says so (exit 128 + signal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from app.signals import exit_when_terminated


def register(app: typer.Typer) -> None:
    """Add the `prepare` subcommand to `app`."""

    @app.command("prepare")
    def prepare(
        format: str | None = typer.Option(
            None,
            "--format",
            help="Raw layout: seed (PNG + mask), bot (TIFF + SVG), class-folders, idx (MNIST/Fashion-MNIST IDX "
            "files, e.g. /usr/share/datasets/fashion-mnist). (default: seed)",
        ),
        input: Path | None = typer.Option(None, "--input", help="Raw dataset folder (read-only)."),
        out: Path | None = typer.Option(None, "--out", help="Prepared dataset folder to create."),
        hospitals: int | None = typer.Option(None, "--clients", help="Number of hospitals M. (default: 5)"),
        tile: int | None = typer.Option(None, "--tile", help="Tile side in pixels. (default: 128)"),
        stride: int | None = typer.Option(None, "--stride", help="Grid step in pixels. (default: the tile size)"),
        abnormal_stride: int | None = typer.Option(
            None, "--abnormal-stride", help="Grid step on abnormal slides. (default: half the stride)"
        ),
        white_max: float | None = typer.Option(
            None,
            "--white-max",
            help="With --mask-outside: drop abnormal training tiles whose white share, counting pixels outside the "
            "mask, exceeds this. (default: 0.5)",
        ),
        background_max: float | None = typer.Option(
            None,
            "--background-max",
            help="Drop tiles (either class, raw pixels) whose near-white ratio exceeds this. (default: 0.5)",
        ),
        abnormal_coverage: float | None = typer.Option(
            None,
            "--abnormal-coverage",
            help="A tile of an abnormal slide is abnormal when at least this share of its tissue is inside the "
            "mask; tiles below it are left out and counted. (default: 0.5)",
        ),
        mask_outside: bool | None = typer.Option(
            None,
            "--mask-outside/--no-mask-outside",
            help="The paper's Step a.1 for TRAINING tiles only: whiten everything outside the cancer mask. A "
            "departure that writes the label into the pixels (recorded in prepare.json); test tiles stay raw. "
            "(default: off)",
        ),
        white_level: int | None = typer.Option(
            None, "--white-level", help="A pixel is near-white when all channels are >= this. (default: 220)"
        ),
        grayscale_hospitals: str | None = typer.Option(
            None, "--grayscale-clients", help="Hospitals whose tiles are stored single-channel, e.g. 0,2."
        ),
        partition: str | None = typer.Option(
            None,
            "--partition",
            help="Label distribution: iid, dirichlet:ALPHA, classes:S, abnormal:F0,F1,... (each hospital's share "
            "of abnormal slides, e.g. abnormal:0.2,0.2,0.8), or PFLlib's pat:S, pat-balanced:S, dir:ALPHA (which "
            "also split train/test as PFLlib does). (default: iid)",
        ),
        sizes: str | None = typer.Option(
            None, "--sizes", help="Slides per hospital: equal, random, or ratios like 3,2,1,1,1. (default: random)"
        ),
        test_fraction: float | None = typer.Option(
            None, "--test-fraction", help="Share of each hospital's slides used for test. (default: 0.2)"
        ),
        val_fraction: float | None = typer.Option(
            None,
            "--val-fraction",
            help="Share of each hospital's slides in its validation split, where thresholds are chosen (0: none). "
            "(default: 0.2)",
        ),
        seed: int | None = typer.Option(None, "--seed", help="Seed of every random choice. (default: 0)"),
        mask_suffix: str | None = typer.Option(
            None, "--mask-suffix", help="SEED: mask beside the slide is <id><suffix>.png. (default: _mask)"
        ),
        mask_dir: str | None = typer.Option(
            None, "--mask-dir", help="SEED: or the mask is <mask-dir>/<id>.png. (default: masks)"
        ),
        mask_threshold: int | None = typer.Option(
            None, "--mask-threshold", help="SEED: accept non-binary masks, cancer = value > T. (default: off)"
        ),
        hospital_scale: str | None = typer.Option(
            None, "--client-scale", help="Per-hospital resolution, e.g. 1,0.5,1 (0.5 = scanned at half resolution)."
        ),
        hospital_tile: str | None = typer.Option(None, "--client-tile", help="Per-hospital tile px, e.g. 128,64,128."),
        hospital_group: str | None = typer.Option(
            None,
            "--client-group",
            help="Per-hospital group name, e.g. A,A,B,B (recorded in prepare.json for analyses such as "
            "gastric-fl report --amp-groups; changes no tile).",
        ),
        classes: str | None = typer.Option(
            None,
            "--classes",
            help="class-folders: the class folders to read, in class-index order, e.g. 0,1,2. "
            "(default: every folder with images; normal,abnormal first when those are all)",
        ),
        site_shift: str | None = typer.Option(
            None,
            "--site-shift",
            help="Simulated sites: none, or random (each hospital's tiles get its own stain and scanner profile: "
            "H&E colour and strength, brightness, blur, JPEG). (default: none)",
        ),
        site_strength: float | None = typer.Option(
            None, "--site-strength", help="How far random site profiles depart from the slides, 0..2. (default: 1)"
        ),
        max_tiles_per_slide: int | None = typer.Option(
            None, "--max-tiles-per-slide", help="Keep at most N tiles per slide (random, seeded)."
        ),
        max_pixels: int | None = typer.Option(
            None,
            "--max-pixels",
            help="Skip (or, with --strict, stop at) a slide or mask whose header declares more pixels than this, "
            "before decoding it. (default: 67108864 = 8192 x 8192)",
        ),
        workers: int | None = typer.Option(None, "--workers", help="Threads for decoding/tiling. (default: 2)"),
        config: Path | None = typer.Option(
            None, "--config", help="TOML preset (sections as in configs/prepare_*.toml)."
        ),
        overwrite: bool | None = typer.Option(
            None, "--overwrite/--no-overwrite", help="Replace an existing prepared dataset at --out."
        ),
        strict: bool | None = typer.Option(
            None, "--strict/--no-strict", help="Stop at the first bad slide instead of skipping it."
        ),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
    ) -> None:
        """Turn a raw slide folder into per-hospital tile datasets (manifest.csv, prepare.json, report).

        Example: gastric-fl prepare --format seed --input data/raw/demo --out data/prepared/demo --clients 3
        --grayscale-clients 2. Options override the --config file; bad slides are skipped and listed in the
        report (or stop the run with --strict). Details: docs/pipeline.md.
        """
        from pipeline.config import build_config, load_toml, parse_float_list, parse_int_list
        from pipeline.errors import PipelineError
        from pipeline.prepare import prepare_dataset

        toml = load_toml(config) if config is not None else {}
        overrides: dict[str, dict[str, Any]] = {
            "source": {
                "format": format,
                "input": input,
                "mask_suffix": mask_suffix,
                "mask_dir": mask_dir,
                "mask_threshold": mask_threshold,
                "classes": classes,
                "max_pixels": max_pixels,
            },
            "split": {
                "clients": hospitals,
                "sizes": sizes,
                "partition": partition,
                "test_fraction": test_fraction,
                "val_fraction": val_fraction,
                "seed": seed,
            },
            "tiles": {
                "tile": tile,
                "stride": stride,
                "abnormal_stride": abnormal_stride,
                "white_max": white_max,
                "background_max": background_max,
                "white_level": white_level,
                "max_tiles_per_slide": max_tiles_per_slide,
                "abnormal_coverage": abnormal_coverage,
                "mask_outside": mask_outside,
            },
            "clients": {
                "grayscale": None
                if grayscale_hospitals is None
                else parse_int_list(grayscale_hospitals, "--grayscale-clients"),
                "scale": None if hospital_scale is None else parse_float_list(hospital_scale, "--client-scale"),
                "tile": None if hospital_tile is None else parse_int_list(hospital_tile, "--client-tile"),
                "group": hospital_group,
            },
            "sites": {"shift": site_shift, "strength": site_strength},
            "output": {"out": out, "overwrite": overwrite, "strict": strict, "workers": workers, "progress": progress},
        }
        for section, key, flag in (("source", "input", "--input"), ("output", "out", "--out")):
            if overrides[section][key] is None and key not in toml.get(section, {}):
                raise PipelineError(f"{flag} is required (or set [{section}] {key} in the --config file)")
        resolved = build_config(toml, overrides, origin=str(config) if config else "configuration")
        with exit_when_terminated("prepare", resolved.output.out):
            result = prepare_dataset(resolved)
        typer.echo(result.report)
        typer.echo(
            f"wrote {result.tiles} tiles from {result.slides} slides to {result.out} in {result.seconds:.1f} s "
            f"({len(result.skipped)} skipped); see {result.out / 'report.md'}"
        )
