"""`gastric-fl ablate`: run a grid of federations (FedSAF paper 001, Tables 4-7) and write paper-style tables.

Every cell is an ordinary run directory made by the same engine as ``gastric-fl train``; the grid is resumable
(finished cells are skipped, interrupted ones resumed). Layout: ``data/README.md`` section 4; guide:
``docs/ablations.md``. Exit codes: 0 every cell finished, 2 bad input or some cells failed (they are listed in
``ablation.json`` with their errors), 130 interrupted (run the same command again to continue).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

DEFAULT_ABLATIONS = Path("data/ablations")


def register(app: typer.Typer) -> None:
    """Add the `ablate` subcommand to `app`."""

    @app.command("ablate")
    def ablate(
        config: Path = typer.Option(
            ...,
            "--config",
            "-c",
            help="Run preset (e.g. configs/benchmark.toml) used with --grid, or an ablation preset "
            "(configs/ablation_*.toml) that names its run preset and grid.",
        ),
        grid: list[str] = typer.Option(
            [],
            "--grid",
            help="One setting and its values, e.g. --grid nhead=0,3,6,9,12 --grid fim=on,off (repeatable; the grid is "
            "their product). Names: strategy, nhead, dm, fim, split, alpha_k, sigma, lam, scale, mu, model, rounds, "
            "or any section.key.",
        ),
        seeds: int | None = typer.Option(
            None, "--seeds", help="Seeds per cell (run.seed, run.seed+1, ...). Default: the preset's, else 1."
        ),
        out: Path | None = typer.Option(
            None, "--out", help="Ablation folder (default: data/ablations/<preset name>). Re-run to resume."
        ),
        overrides: list[str] = typer.Option(
            [], "--set", help="Override a setting of every cell, e.g. --set run.rounds=2 (repeatable)."
        ),
        data: Path | None = typer.Option(None, "--data", help="Prepared dataset folder (overrides data.path)."),
        table: str = typer.Option(
            "auto",
            "--table",
            help="Table for a --grid: auto, components (Table 4), distances (5), nhead (6), methods (7), all.",
        ),
        tables_only: bool = typer.Option(
            False, "--tables-only", help="Only rebuild the tables and figures from the cells already finished."
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-round progress bars."),
        workers: int | None = typer.Option(
            None,
            "--workers",
            help="Cells run at once, one process each (a GPU each when several are visible; with one GPU they share "
            "it). The figures are the sequential grid's. Default 1; with --ray, as many as the cluster places.",
            show_default=False,
        ),
        ray: str | None = typer.Option(
            None,
            "--ray",
            help="Run the cells as tasks on a Ray cluster: its head's host:port (ray start --head), auto, or local "
            "(one started here for this grid). Every node must see --out and the datasets at the same paths.",
        ),
        publish_to: Path | None = typer.Option(
            None,
            "--publish",
            help="Also copy the tables, each run's config and per-round records (no weights), the package versions "
            "and this command to this folder (e.g. results/NAME), so the tables can be checked and rebuilt.",
        ),
    ) -> None:
        """Run an ablation grid (resumable) and write Table 4-7 style Markdown/CSV tables and accuracy curves.

        With Separate or FedAvg in the grid, also each method's paired difference to them over the same seeds,
        with its 95% interval and the smallest difference the seeds could detect (MDD, 80% power; paired.md /
        paired.csv, printed).
        """
        from federation.ablation import load_plan, publish, run_plan, shown_path, write_tables
        from federation.engine import RunStopped
        from federation.errors import FederationError

        plan = load_plan(config, grid, seeds, overrides, table, data)
        folder = out if out is not None else DEFAULT_ABLATIONS / config.stem
        state: dict[str, object] | None = None
        if not tables_only:
            try:
                state = run_plan(
                    plan,
                    folder,
                    progress=not quiet,
                    echo=lambda line: typer.echo(line, err=True),
                    workers=workers,
                    ray=ray,
                )
            except (KeyboardInterrupt, RunStopped) as exc:
                import signal

                signal.signal(signal.SIGINT, signal.SIG_IGN)  # already stopping: a second Ctrl-C has nothing to cut
                typer.echo(f"{stopped_words(exc)}; run the same command again to continue", err=True)
                raise typer.Exit(130) from exc
        # --tables-only rebuilds tables, also in a published copy that holds no weights: no per-run reports then.
        paths = write_tables(plan, folder, per_run_reports=not tables_only)
        # each method minus Separate / FedAvg, seed by seed, with its interval and MDD (docs/ablations.md)
        if "paired" in paths:
            typer.echo(paths["paired"].read_text(encoding="utf-8"))
            typer.echo(f"paired differences: {paths['paired']} (and paired.csv)")
        typer.echo(f"tables: {paths['results']}")
        if publish_to is not None:
            trains = training_arguments(sys.argv[1:])
            command = shlex.join(["gastric-fl", *trains])
            rebuild = shlex.join(["gastric-fl", *_with_out(trains, shown_path(publish_to)), "--tables-only"])
            files = publish(plan, folder, publish_to, command, rebuild)
            typer.echo(f"published {len(files)} files to {publish_to} (rebuild: see {publish_to / 'COMMAND.md'})")
        if state is not None:
            cells = state["cells"]
            assert isinstance(cells, list)
            failed = [c for c in cells if c.get("status") == "failed"]
            if failed:
                raise FederationError(
                    f"{len(failed)} of {len(cells)} cells failed (first: {failed[0]['id']}: {failed[0]['error']}); "
                    f"see {folder / 'ablation.json'}"
                )


def stopped_words(exc: BaseException) -> str:
    """How an ablation was stopped, in words: a bare Ctrl-C (``KeyboardInterrupt()`` says nothing: it printed
    "()"), or the first clause of what the interruption says ("stopped after round 3", "stopped by SIGTERM"),
    without its advice to resume one run (the grid resumes by running the same command again)."""
    said = str(exc).split(";")[0].strip()
    if not said:
        return "stopped by Ctrl-C"
    return said if said.startswith("stopped") else f"stopped ({said})"


def training_arguments(argv: list[str]) -> list[str]:
    """``argv`` without ``--tables-only`` and ``--publish DIR``: the command that trains (and resumes) the grid."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--publish":
            skip = True
        elif arg != "--tables-only" and not arg.startswith("--publish="):
            kept.append(arg)
    return kept


def _with_out(argv: list[str], out: str) -> list[str]:
    """``argv`` with its ``--out`` value (if any) replaced by ``out``, or ``--out out`` appended."""
    kept = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    return [a for a in kept if not a.startswith("--out=")] + ["--out", out]
