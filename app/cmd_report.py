"""`gastric-fl report`: the paper-style table (FedSAF paper 001, Tables 4-7) and accuracy curves of runs.

Prints the run table and the per-hospital table, and writes ``report.md``, ``report.csv``, ``hospitals.csv`` and
``accuracy.png`` (averaged and std test accuracy over rounds, runs overlaid). ``--transmitted`` instead prints
the values sent per client and round for each ``nhead`` of a model, computed from its ``state_dict``.
Each hospital whose predictions are on this machine is judged at its model card's threshold against the floor
(``--floor``, ``--min-slides``, ``--review-specificity``: the dashboard's Verdict page's inputs, the same defaults)
by `app.verdicts`, so the report says what the Verdict page says with that floor.
``--amp-groups`` instead measures whether AMP's weights concentrate within groups of similar hospitals
(`federation.amp_groups`: per round, the within-group share of each hospital's peer weight against chance), with
the groups of the dataset's ``prepare.json`` or ``--groups``, and writes ``amp_groups.md``.
``--html`` instead writes one self-contained HTML report per hospital (`app.report_html`: metrics at the model
card's threshold, ROC curve, confusion matrix, example tiles, a slide heatmap, settings and dataset hash) into
the hospital's own folder, ``<run>/hospitals/client_XX/report.html`` (it holds the hospital's tiles and per-tile
probabilities, which the run's server part never holds), or as ``client_XX.html`` into ``--out``.
Damaged lines of the run files and rounds missing hospitals are printed as one ``warning:`` line each (stderr)
and listed in ``report.md``; the figures then come from the last complete round.
"""

from __future__ import annotations

from pathlib import Path

import typer

from app import cli_floor


def register(app: typer.Typer) -> None:
    """Add the `report` subcommand to `app`."""

    @app.command("report")
    def report(
        runs: list[Path] = typer.Argument(None, help="One or more run directories (gastric-fl train output)."),
        out: Path | None = typer.Option(
            None, "--out", help="Where to write the report files (default: the run directory when there is one run)."
        ),
        transmitted: str | None = typer.Option(
            None,
            "--transmitted",
            help="Instead of a run report: values transmitted per hospital and round for MODEL at nhead 0/3/6/9/12.",
            metavar="MODEL",
        ),
        html: bool = typer.Option(
            False,
            "--html",
            help="Instead of the tables: one self-contained HTML report per hospital (metrics, ROC, confusion matrix, "
            "example tiles, a slide heatmap, settings), as <run>/hospitals/client_XX/report.html (the hospital's own "
            "folder) or as client_XX.html in --out.",
        ),
        hospital: list[int] = typer.Option(
            None, "--hospital", help="With --html: only this hospital (repeatable; default: every hospital)."
        ),
        amp_groups: bool = typer.Option(
            False,
            "--amp-groups",
            help="Instead of the tables: per round, the share of AMP's weight on other hospitals (xi, FedSAF/FedAMP) "
            "that stays within each hospital's group, against chance; groups from the dataset's prepare.json "
            "(clients.group) or --groups. Writes amp_groups.md into the run (or --out).",
        ),
        groups: str | None = typer.Option(
            None,
            "--groups",
            help="With --amp-groups (implies it): each hospital's group, comma-separated in hospital order, e.g. "
            "0,0,0,1,1,1 (default: the dataset's prepare.json).",
        ),
        floor: float = cli_floor.SENSITIVITY,
        min_slides: int = cli_floor.MIN_SLIDES,
        review_specificity: float = cli_floor.SPECIFICITY,
    ) -> None:
        """Summarise runs: averaged/std/best test ACC and AUC, per-hospital AUC, values sent, seconds per round."""
        from federation.errors import FederationError
        from federation.report import (
            HOSPITAL_COLUMNS,
            OPERATING_COLUMNS,
            SUMMARY_COLUMNS,
            VERDICT_COLUMNS,
            load_run,
            markdown_table,
            operating_points,
            per_hospital,
            runs_intended_use,
            summarise,
            transmitted_values,
            write_report,
        )

        judged_floor = cli_floor.floor_from(floor, min_slides, review_specificity)
        if amp_groups or groups is not None:
            if transmitted is not None or html or hospital:
                raise FederationError(
                    "--amp-groups is a report of its own: leave out --transmitted, --html, --hospital"
                )
            _amp_groups(list(runs or ()), groups, out)
            return
        if transmitted is not None:
            if html:
                raise FederationError("--transmitted and --html are separate reports: give one of them")
            typer.echo(markdown_table(transmitted_values(transmitted)), nl=False)
            return
        if html:
            from app.report_html import write_html_reports

            def warn(message: str) -> None:
                typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)

            reports = write_html_reports(list(runs or ()), out, hospital or None, warn=warn, floor=judged_floor)
            for path in reports:
                typer.echo(f"wrote {path}")
            return
        if hospital:
            raise FederationError("--hospital applies to --html reports; add --html")
        if not runs:
            raise FederationError("give at least one run directory, e.g. gastric-fl report data/runs/quickstart")
        results = [load_run(r) for r in runs]
        for problem in (p for result in results for p in result.problems):
            typer.secho(f"warning: {problem}", fg=typer.colors.YELLOW, err=True)
        if out is None:
            if len(results) > 1:
                raise FederationError("several runs: say where the comparison goes with --out DIR")
            out = results[0].run_dir
        typer.echo(markdown_table(summarise(results), SUMMARY_COLUMNS))
        typer.echo(markdown_table(per_hospital(results), HOSPITAL_COLUMNS))
        from app.verdicts import verdict_rows

        verdicts = verdict_rows([r.run_dir for r in results], judged_floor)
        if verdicts:
            typer.echo(f"verdicts against the floor: {judged_floor.words}")
            typer.echo(markdown_table(verdicts, VERDICT_COLUMNS))
        from federation.report import classes_note

        if classes_note(results):
            typer.echo(classes_note(results))
        operating = operating_points(results)
        if operating:
            typer.echo(markdown_table(operating, OPERATING_COLUMNS))
        paths = write_report(results, out, verdicts, judged_floor.words)
        typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}", err=True)
        typer.echo(f"note: {runs_intended_use(results)}", err=True)


def _amp_groups(runs: list[Path], groups: str | None, out: Path | None) -> None:
    """``--amp-groups``: each run's per-round within-group share of AMP's weights (`federation.amp_groups`), printed
    and written as ``amp_groups.md``; records left out are ``warning:`` lines."""
    from federation.amp_groups import amp_groups_report, parse_groups, round_table
    from federation.errors import FederationError

    if not runs:
        raise FederationError("give a run directory, e.g. gastric-fl report data/runs/clustered --amp-groups")
    if out is not None and len(runs) > 1:
        raise FederationError("--out with several runs would write one amp_groups.md over another: give one run")
    given = parse_groups(groups) if groups is not None else None
    for run in runs:
        result = amp_groups_report(run, given, out)
        for problem in result.shares.problems:
            typer.secho(f"warning: {problem}", fg=typer.colors.YELLOW, err=True)
        typer.echo(f"{run.name}: AMP's weight within groups ({result.source})")
        typer.echo(round_table(result.shares))
        typer.echo(f"wrote {result.path}", err=True)
