"""`gastric-fl synth`: write a synthetic SEED- or BOT-layout dataset (FedSAF paper 001, Sec. 4.1, Table 2), or
scikit-learn's bundled digits in the class-folders layout (``--format digits``, the paper's "other datasets")."""

from __future__ import annotations

from pathlib import Path

import typer

from app.signals import exit_when_terminated


def register(app: typer.Typer) -> None:
    """Add the `synth` subcommand to `app`."""

    @app.command(
        "synth",
        help=(
            "Generate synthetic H&E gastric slides in the SEED or BOT raw layout (see data/README.md and "
            "docs/synthetic-data.md), or write scikit-learn's bundled digits (real, 1,797 images, 10 classes, "
            "no download) in the class-folders layout with --format digits.\n\n"
            "Every slide carries benign look-alikes (chronic gastritis, lymphoid follicles, reactive epithelium, "
            "intestinal metaplasia); abnormal slides add carcinoma regions (intestinal-type, well-differentiated "
            "tubular or signet-ring cell), marked in the mask (seed) or the SVG annotation (bot). Darkness and "
            "colour do not tell the classes apart; morphology does (docs/synthetic-data.md, 'Patterns').\n\n"
            "Example: gastric-fl synth --format seed --images 60 --difficulty 0.3 --out data/raw/demo\n\n"
            "Digits: gastric-fl synth --format digits --out data/raw/digits"
        ),
    )
    def synth(
        fmt: str = typer.Option(
            "seed",
            "--format",
            "-f",
            help="Raw layout to write: 'seed' (512x512 PNG + <id>_mask.png), 'bot' (2048x2048 TIFF in "
            "normal/ and abnormal/, an SVG annotation beside each abnormal slide), or 'digits' (scikit-learn's "
            "digits as 0/ ... 9/ class folders of 64x64 PNGs).",
            show_default=True,
        ),
        images: int | None = typer.Option(
            None, "--images", "-n", help="Number of slides to write. (default: 40; digits always writes all 1,797)"
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            "-o",
            help="Output directory (new or empty, or a previous synth output with --overwrite). "
            "Default: data/raw/synth_<format>.",
            show_default=False,
        ),
        seed: int = typer.Option(0, "--seed", help="Random seed: same seed and options give identical files."),
        difficulty: float | None = typer.Option(
            None,
            "--difficulty",
            "-d",
            help="0..1. Higher values shrink the carcinoma, soften its atypia and add mild atypia to normal "
            "slides, so classifiers do not saturate. (default: 0)",
        ),
        abnormal_fraction: float | None = typer.Option(
            None,
            "--abnormal-fraction",
            help="Share of abnormal slides, 0..1. Default: 0.5 for seed, 0.8 for bot (BOT's 560 of 700).",
            show_default=False,
        ),
        size: int | None = typer.Option(
            None,
            "--size",
            help="Slide side in pixels (>= 128); tissue features scale with it. Default: the format's real "
            "size (seed 512, bot 2048). Digits: image side, a multiple of 8 (default 64).",
            show_default=False,
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace a previous synth output in --out (never foreign files)."
        ),
        tissue: str = typer.Option(
            "gastric",
            "--tissue",
            help="Mixture of tissue patterns: 'gastric' (carcinoma subtypes and benign look-alikes) or 'classic' "
            "(the tissue of earlier versions, byte for byte: every carcinoma darker than anything benign).",
        ),
        mix: str | None = typer.Option(
            None,
            "--mix",
            help="Override the mixture's weights, e.g. 'tubular=2,signet_ring=0,follicle=1.5': carcinoma subtypes "
            "intestinal, tubular, signet_ring (relative weights per region); benign gastritis, follicle, reactive, "
            "metaplasia (mean patches per slide).",
            show_default=False,
        ),
        workers: int = typer.Option(
            1,
            "--workers",
            help="Slides painted at once, one process each (a BOT-sized set of 700 slides: use the cores you "
            "have). The files are identical for any value.",
        ),
    ) -> None:
        """Write a synthetic dataset and print where it is and its class counts."""
        from pipeline.errors import PipelineError
        from pipeline.synth import generate_dataset

        fmt = fmt.strip().lower()
        target = out if out is not None else Path("data/raw") / (f"synth_{fmt}" if fmt != "digits" else "digits")
        if fmt == "digits":
            given = [
                flag
                for flag, value in (
                    ("--images", images),
                    ("--difficulty", difficulty),
                    ("--abnormal-fraction", abnormal_fraction),
                    ("--mix", mix),
                )
                if value is not None
            ]
            if given:
                raise PipelineError(
                    f"{given[0]} does not apply to --format digits (it writes scikit-learn's 1,797 digits as they "
                    "are); leave it out"
                )
            _digits(target, size, overwrite)
            return
        # SIGTERM cleans up like Ctrl-C: no hidden half-written folder
        with exit_when_terminated("synth", target):
            summary = generate_dataset(
                target,
                fmt,
                40 if images is None else images,
                seed=seed,
                difficulty=0.0 if difficulty is None else difficulty,
                abnormal_fraction=abnormal_fraction,
                size=size,
                progress=True,
                overwrite=overwrite,
                workers=workers,
                tissue=tissue.strip().lower(),
                mix=mix,
            )
        typer.echo(
            f"wrote {summary.images} synthetic {fmt.upper()} slides ({summary.size}x{summary.size}): "
            f"{summary.n_normal} normal, {summary.n_abnormal} abnormal, {len(summary.files)} files"
        )
        typer.echo(f"dataset: {summary.out.resolve()}")


def _digits(target: Path, size: int | None, overwrite: bool) -> None:
    """``synth --format digits``: export scikit-learn's digits and print the counts per class."""
    from pipeline.digits import DEFAULT_SIZE, export_digits

    with exit_when_terminated("synth", target):
        summary = export_digits(target, DEFAULT_SIZE if size is None else size, progress=True, overwrite=overwrite)
    per_class = ", ".join(f"{name}: {count}" for name, count in summary.counts.items())
    typer.echo(
        f"wrote {summary.images} scikit-learn digits ({summary.size}x{summary.size} PNG, class folders) - {per_class}"
    )
    typer.echo(f"dataset: {summary.out.resolve()}")
