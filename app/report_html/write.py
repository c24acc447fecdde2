"""Writing the HTML reports: `write_html_reports`, behind ``gastric-fl report --html``.

A report holds the hospital's tile images and per-tile probabilities, so by default it goes where the hospital's
predictions already are, its own folder: ``<run>/hospitals/client_XX/report.html`` (data/README.md section 3; the
run's server part never holds such data). ``--out DIR`` writes ``client_XX.html`` files to a folder of the user's
choosing instead; output safety then follows `infra.outputs`: the folder is locked while it is written
(`claim_output`), carries the ``report`` ownership marker, and a folder holding files the command did not write is
refused (`infra.outputs.check_addable`). Each file is written to a temporary name and renamed, and everything is
built before anything is written, so bad input leaves no partial output (docs/dashboard.md, "The hospital's report:
`gastric-fl report --html`"). The top of the package: it imports ``load``, ``scoring`` and ``page``, and nothing
of the package imports it but ``__init__`` (docs/design.md, "Layout and layers").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app import slide_view
from app.report_html.load import ClassReport, ReportError, hospital_folders, load_hospital, load_report
from app.report_html.multiclass import render_classes
from app.report_html.page import render
from app.report_html.scoring import score_held_out_slides, score_one_slide
from federation.runfiles import REPORT_HTML, hospital_name
from infra.outputs import OutputError, check_addable, claim_output, os_error_message, write_marker

if TYPE_CHECKING:
    from app.evaluation.verdict import Floor

COMMAND = "report"
HOSPITAL_REPORT = REPORT_HTML  # in the hospital's own folder, beside its predictions.csv


def write_html_reports(
    runs: Sequence[Path],
    out: Path | None = None,
    hospitals: Sequence[int] | None = None,
    *,
    score_missing: bool = True,
    warn: Callable[[str], None] | None = None,
    floor: Floor | None = None,
) -> list[Path]:
    """``gastric-fl report --html``: one report per hospital of each run; returns the paths written.

    By default each report is ``<run>/hospitals/client_XX/report.html``, in the hospital's own folder. With ``out``
    the reports are ``out/client_XX.html`` (several runs: ``out/<run name>/client_XX.html``) in a folder carrying
    the ``report`` marker. ``score_missing`` scores the hospital's test slides into ``slides.csv`` when the run did not
    (a deployed hospital's run ends on its own machine) and one test slide per hospital for the heatmap (imports
    torch). All reports are built before any is written.
    """
    if not runs:
        raise ReportError("give at least one run directory, e.g. gastric-fl report data/runs/quickstart --html")
    own_folders: list[tuple[Path, str]] = []  # (file in a hospital's folder, page)
    out_folders: list[tuple[Path, dict[str, str]]] = []  # (--out folder, file name -> page)
    for run in runs:
        if not run.is_dir():
            raise ReportError(f"run directory {run} does not exist: give a folder made by gastric-fl train")
        chosen = list(hospitals) if hospitals else list(hospital_folders(run))
        if not chosen:
            raise ReportError(
                f"{run / 'hospitals'} holds no hospital with a predictions.csv: the run has not finished a round "
                "on this machine (in a deployment each hospital reports on its own machine)"
            )
        pages: dict[str, str] = {}
        for hospital in chosen:
            found = load_report(run, hospital)
            if isinstance(found, ClassReport):  # no slides to score: slide calls do not apply to its classes
                page = render_classes(found)
                pages[f"{hospital_name(hospital)}.html"] = page
                own_folders.append((found.folder / HOSPITAL_REPORT, page))
                continue
            rep = found
            if score_missing and rep.held_out is None and rep.card:
                # a deployed hospital's run ends on its own machine: its held-out slides are scored here, once
                problem = score_held_out_slides(rep)
                if problem is None:
                    rep = load_hospital(run, hospital)
                else:
                    rep.notes.append(problem)
            if score_missing:
                problem = score_one_slide(rep)
                if problem:
                    rep.notes.append(problem)
                    if warn is not None:
                        warn(f"{rep.folder}: {problem}")
            page = render(rep, floor)
            pages[f"{hospital_name(hospital)}.html"] = page
            own_folders.append((rep.folder / HOSPITAL_REPORT, page))
        if out is not None:
            out_folders.append((out if len(runs) == 1 else out / run.name, pages))
    written: list[Path] = []
    if out is None:
        for path, page in own_folders:
            try:
                slide_view.write_atomic(path, page.encode("utf-8"))
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
                raise OutputError(
                    f"cannot write {path}: {reason}; make the hospital's folder writable, or write the reports "
                    "elsewhere with --out DIR"
                ) from None
            written.append(path)
        return written
    for dest, pages in out_folders:
        check_addable(dest, COMMAND, what="report --html")
        try:
            with claim_output(dest, COMMAND):
                check_addable(dest, COMMAND, what="report --html")
                dest.mkdir(parents=True, exist_ok=True)
                write_marker(dest, COMMAND, record_contents=False)
                for name, text in pages.items():
                    slide_view.write_atomic(dest / name, text.encode("utf-8"))
                    written.append(dest / name)
        except OSError as exc:
            raise OutputError(os_error_message(exc, dest)) from None
    return written
