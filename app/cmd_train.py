"""`gastric-fl train`: run (or resume) a federation from a TOML preset into a run directory.

The dashboard starts runs through this command and reads the run directory it writes (``data/README.md``
section 3), so its options and exit codes are a contract: 0 finished, 2 bad input or a failed run (one-line
error), 3 finished without a hospital (left out of the last round, or of the whole run at its Hello: its last
lines name each one, the round and why; ``summary.json`` keeps them under ``left_out`` and ``left_out_at_hello``),
130 stopped by Ctrl-C/SIGTERM (resumable with ``--resume``).
"""

from __future__ import annotations

from pathlib import Path

import typer

DEFAULT_RUNS = Path("data/runs")


def register(app: typer.Typer) -> None:
    """Add the `train` subcommand to `app`."""

    @app.command("train")
    def train(
        config: Path | None = typer.Option(
            None, "--config", "-c", help="TOML preset, e.g. configs/demo.toml (defaults for anything it leaves out)."
        ),
        data: Path | None = typer.Option(None, "--data", help="Prepared dataset folder (overrides data.path)."),
        out: Path | None = typer.Option(
            None, "--out", help="Run directory to create (default: data/runs/<run.name>-<UTC time>)."
        ),
        overrides: list[str] = typer.Option(
            [], "--set", help="Override one setting, e.g. --set run.rounds=3 --set strategy.name=fedrep (repeatable)."
        ),
        resume: Path | None = typer.Option(
            None, "--resume", help="Continue this run directory from its last complete checkpoint."
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it already holds a run."),
        engine: str | None = typer.Option(
            None,
            "--engine",
            help="local (default: hospitals in this process), flower-sim (Flower's simulation runtime) or flower "
            "(hospitals deployed as SuperNodes; needs --superlink). Same as --set run.engine=...",
        ),
        superlink: str | None = typer.Option(
            None,
            "--superlink",
            help="HOST:PORT of the federation's SuperLink (with --engine flower); --kit names its CA certificate.",
        ),
        kit: Path | None = typer.Option(
            None,
            "--kit",
            help="Kit folder (gastric-fl federation init) or its server/ folder: its ca.crt verifies the SuperLink.",
        ),
        print_config: bool = typer.Option(
            False, "--print-config", help="Print the fully resolved configuration as TOML and exit."
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    ) -> None:
        """Train hospitals on a prepared dataset with one method (strategy.name; docs/methods.md lists them all)."""
        from federation.config import config_to_toml, load_config
        from federation.engine import RunStopped, load_run_config, resolve_config
        from federation.errors import FederationError
        from federation.launch import train as run_training
        from federation.runs import default_run_dir

        if engine is not None:
            overrides = [*overrides, f"run.engine={engine}"]
        if superlink is not None:
            overrides = [*overrides, f"flower.superlink={superlink}"]
        if kit is not None:
            from federation.flower.kit import Kit

            overrides = [*overrides, f"flower.root_certificates={Kit.load(kit).ca_cert.resolve()}"]
        if resume is not None:
            if config is not None or data is not None or out is not None or overwrite:
                raise FederationError(
                    "--resume continues a run with its own config.toml: drop --config/--data/--out/--overwrite"
                )
            cfg = load_run_config(resume, overrides)
            run_dir = resume
        else:
            cfg = load_config(config, overrides, data)
            run_dir = out if out is not None else default_run_dir(DEFAULT_RUNS, cfg.run.name)
        if print_config:
            typer.echo(config_to_toml(resolve_config(cfg)), nl=False)
            return
        typer.echo(f"run directory: {run_dir}", err=True)
        try:
            written = run_training(cfg, run_dir, resume=resume is not None, overwrite=overwrite, progress=not quiet)
        except RunStopped as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(130) from exc
        from federation.run_reader import RunSummary

        summary = RunSummary(written, present=True)  # the summary.json the run wrote last, typed as readers read it
        missing = summary.left_out
        final = summary.final
        auc = final.get("avg_test_auc")
        without = f" without {len(missing)} hospital(s) (named below)" if missing else ""
        acc = final.get("avg_test_acc", 0)
        classes = summary.classes
        # with more than two classes the AUC is the macro one-vs-rest one
        # (federation.hospital.evaluation.multiclass_auc)
        auc_name = f"macro one-vs-rest AUC ({len(classes)} classes)" if len(classes) > 2 else "AUC"
        typer.echo(
            f"finished {summary.data['rounds_done']} rounds{without}: averaged test accuracy {acc:.4f}, "
            f"{auc_name} {'-' if auc is None else f'{auc:.4f}'}; see {run_dir} (gastric-fl report {run_dir})"
        )
        if summary.status == "finished":
            from app.held_out import score_run

            # Each hospital's held-out test slides, scored as `gastric-fl predict` scores a slide (slides.csv), on
            # the device the run trained on.
            for line in score_run(run_dir, Path(cfg.data.path), cfg.run.device):
                typer.echo(line)
        for line in missing:
            typer.echo(f"warning: {line}", err=True)
        if missing:
            raise typer.Exit(3)
