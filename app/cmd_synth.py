"""`gastric-fl synth`: write a synthetic SEED- or BOT-layout dataset (FedSAF paper 001, Sec. 4.1, Table 2)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the `synth` subcommand to `app`."""

    @app.command(
        "synth",
        help=(
            "Generate synthetic H&E gastric slides in the SEED or BOT raw layout (see data/README.md and "
            "docs/synthetic-data.md).\n\n"
            "Normal slides show regular glands in pink stroma; abnormal slides add carcinoma regions (crowded, "
            "irregular glands with large dark nuclei), marked in the mask (seed) or the SVG annotation (bot).\n\n"
            "Example: gastric-fl synth --format seed --images 60 --difficulty 0.3 --out data/raw/demo"
        ),
    )
    def synth(
        fmt: str = typer.Option(
            "seed",
            "--format",
            "-f",
            help="Raw layout to write: 'seed' (512x512 PNG + <id>_mask.png) or 'bot' (2048x2048 TIFF in "
            "normal/ and abnormal/, an SVG annotation beside each abnormal slide).",
            show_default=True,
        ),
        images: int = typer.Option(40, "--images", "-n", help="Number of slides to write.", show_default=True),
        out: Path | None = typer.Option(
            None,
            "--out",
            "-o",
            help="Output directory (new or empty, or a previous synth output with --overwrite). "
            "Default: data/raw/synth_<format>.",
            show_default=False,
        ),
        seed: int = typer.Option(0, "--seed", help="Random seed: same seed and options give identical files."),
        difficulty: float = typer.Option(
            0.0,
            "--difficulty",
            "-d",
            help="0..1. Higher values shrink the carcinoma, soften its atypia and add mild atypia to normal "
            "slides, so classifiers do not saturate.",
            show_default=True,
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
            "size (seed 512, bot 2048).",
            show_default=False,
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace a previous synth output in --out (never foreign files)."
        ),
    ) -> None:
        """Write a synthetic dataset and print where it is and its class counts."""
        from pipeline.outputs import Terminated, terminate_as_interrupt
        from pipeline.synth import generate_dataset

        fmt = fmt.strip().lower()
        target = out if out is not None else Path("data/raw") / f"synth_{fmt}"
        try:
            with terminate_as_interrupt():  # SIGTERM cleans up like Ctrl-C: no hidden half-written folder
                summary = generate_dataset(
                    target,
                    fmt,
                    images,
                    seed=seed,
                    difficulty=difficulty,
                    abnormal_fraction=abnormal_fraction,
                    size=size,
                    progress=True,
                    overwrite=overwrite,
                )
        except Terminated as stop:
            typer.secho(
                f"error: synth stopped by {stop.name}; nothing was written to {target} (run it again)",
                fg=typer.colors.RED,
                err=True,
            )
            raise typer.Exit(128 + stop.signum) from None
        typer.echo(
            f"wrote {summary.images} synthetic {fmt.upper()} slides ({summary.size}x{summary.size}): "
            f"{summary.n_normal} normal, {summary.n_abnormal} abnormal, {len(summary.files)} files"
        )
        typer.echo(f"dataset: {summary.out.resolve()}")
