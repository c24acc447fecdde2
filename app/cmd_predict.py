"""`gastric-fl predict`: a hospital's exported model on whole slides (issue 12; `inference.predict`).

Tiles every slide as ``prepare`` does, scores each tile with the bundle's model and preprocessing, and writes per
slide a heatmap overlay, a tile CSV and a summary (docs/inference.md). A bundle that does not fit or holds non-finite
weights, a slide that cannot be read, a slide whose header declares more than ``--max-pixels`` pixels (refused before
decoding) and a slide without tissue are one ``error:`` line and exit code 2; a black slide is scored with a
``warning:`` line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from app import cli_floor

if TYPE_CHECKING:
    from app.evaluation.verdict import Floor
    from models.bundle import ModelCard


def register(app: typer.Typer) -> None:
    """Add the `predict` subcommand to `app`."""

    @app.command("predict")
    def predict(
        model: Path = typer.Option(
            ...,
            "--model",
            help="A model bundle: a hospital folder of a run (<run>/hospitals/client_XX) or its model.json.",
        ),
        slide: Path = typer.Option(..., "--slide", help="A slide (SEED PNG, BOT TIFF, ...) or a folder of slides."),
        out: Path = typer.Option(
            ..., "--out", help="Folder for the results (new, empty, or an earlier predict output)."
        ),
        threshold: float | None = typer.Option(
            None, "--threshold", help="Decision threshold on P(abnormal) (default: the card's, 0.5)."
        ),
        top_k: int = typer.Option(
            5, "--top-k", help="How many of the highest tile probabilities the top-k mean takes."
        ),
        batch_size: int = typer.Option(64, "--batch-size", help="Tiles per forward pass."),
        max_side: int = typer.Option(
            4096, "--max-side", help="Overlays of slides whose longer side exceeds this are downscaled to it."
        ),
        max_pixels: int | None = typer.Option(
            None,
            "--max-pixels",
            help="Refuse, before decoding, a slide whose header declares more pixels than this "
            "(default 67108864 = 8192 x 8192; at most 1073741824).",
        ),
        device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
        floor: float = cli_floor.SENSITIVITY,
        min_slides: int = cli_floor.MIN_SLIDES,
        review_specificity: float = cli_floor.SPECIFICITY,
    ) -> None:
        """Score whole slides with one hospital's model: heatmap overlay, tile CSV and summary per slide; first the
        model's intended use and, where its folder holds its test predictions, its verdict against the floor."""
        from inference.predict import predict as run_predict
        from inference.results import slide_calls_line
        from pipeline.images import DEFAULT_MAX_PIXELS

        def warn(message: str) -> None:
            typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)

        judged_floor = cli_floor.floor_from(floor, min_slides, review_specificity)
        from models.bundle import bundle_folder, read_card

        folder = bundle_folder(model)
        card = read_card(folder)
        typer.echo(f"intended use: {card.intended_use}")
        results = run_predict(
            model,
            slide,
            out,
            threshold=threshold,
            top_k=top_k,
            batch_size=batch_size,
            max_side=max_side,
            device=device,
            progress=progress,
            warn=warn,
            max_pixels=DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels,
        )
        for result in results:
            s = result.summary
            truth = s.get("ground_truth")
            share = s.get("unfamiliar_share")
            line = (
                f"{s['folder']}: {s['tiles']} tiles, max {s['max_probability']:.3f}, "
                f"top-{s['top_k']} mean {s['top_k_mean']:.3f}, abnormal area {s['abnormal_area_fraction']:.1%}, "
                f"unfamiliar tissue {'n/a' if share is None else f'{share:.1%}'}, "
                f"called {s['call']} at threshold {s['threshold']:.2f} ({s['threshold_source']})"
            )
            if s.get("reported") and s["reported"] != s["call"]:
                line += f", reported as {s['reported']}"
            if s.get("outcome"):
                line += f", {s['outcome']}"
            if truth is not None:

                def show(value: float | None) -> str:
                    return "n/a" if value is None else f"{value:.3f}"

                line += f", sensitivity {show(truth['sensitivity'])}, specificity {show(truth['specificity'])}"
            typer.echo(line)
        notes = sorted(
            {
                str(r.summary["tissue"])
                for r in results
                if r.summary.get("unfamiliar_share") is None or r.summary.get("tissue_weak")
            }
        )
        for note in notes:
            typer.echo(f"tissue: {note}")
        calls = slide_calls_line(results)
        if calls is not None:
            typer.echo(calls)
        for line in _verdict_lines(folder, card, judged_floor, threshold):  # after the slides: reads the test split
            typer.echo(line)
        typer.echo(f"wrote {out}", err=True)


def _verdict_lines(folder: Path, card: ModelCard, floor: Floor, override: float | None) -> list[str]:
    """The bundle's hospital's verdict at its card's threshold against ``floor`` when its folder holds the
    hospital's test predictions (`app.verdicts.judge_folder`: what the Verdict page says), or why not."""
    from app.evaluation.tables import verdict_word
    from app.run_cards import CardThreshold
    from app.verdicts import judge_folder

    lines: list[str] = []
    operating = CardThreshold(card.threshold, card.threshold_source, card.threshold_split)
    judged = judge_folder(folder, operating, card.hospital, floor)
    if judged is None:
        lines.append(
            f"verdict: not judged here ({folder} holds no test predictions of its hospital; the run's Verdict page "
            "or gastric-fl report judges it)"
        )
        return lines
    lines.append(
        f"verdict of hospital {card.hospital}'s model at its threshold {judged.threshold:.2f}: "
        f"{verdict_word(judged.verdict.kind, floor)}, {judged.verdict.reason} (against the floor: {floor.words})"
    )
    if override is not None and abs(override - card.threshold) > 1e-12:
        lines.append(f"note: the slides above were called at --threshold {override:.2f}, not at the card's threshold")
    return lines
