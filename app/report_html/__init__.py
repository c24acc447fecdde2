"""One self-contained HTML report per run and hospital: ``gastric-fl report --html`` and the Slide page's download.

What a clinician needs to judge one hospital's model (issue 12, "an export"), from the files the hospital owns
(``<run>/hospitals/client_XX/``: ``predictions.csv``, the model card ``model.json``, scored slides) and the run's
``config.toml``, ``summary.json`` and ``metrics.jsonl``: its metrics at the card's threshold, the verdict, the ROC
curve and confusion matrix, example tiles, slide calls and heatmaps, and the settings (docs/dashboard.md, "The
hospital's report: `gastric-fl report --html`").

The package has one module per concern, and every public name is re-exported here:

- ``load``: reading a hospital's files into a `HospitalReport` (`load_hospital`, `read_predictions`,
  `hospital_folders`); `ReportError` for a run or hospital the report cannot be made from;
- ``figures``: the PNGs (ROC curve, confusion matrix, colour bar, heatmaps and test tiles), colour-blind safe;
- ``scoring``: scoring the hospital's test slides where the run did not (`score_held_out_slides`,
  `score_one_slide`; these import torch);
- ``page``: the HTML document (`render`, `report_html`);
- ``write``: `write_html_reports`, where the files go and how they are written safely.

Imports run one way (docs/design.md, "Layout and layers"): ``page`` uses ``figures`` and ``load``, ``scoring`` uses
``load``, ``write`` uses ``load``, ``scoring`` and ``page``; nothing but this file and ``write`` imports ``page``.
Building a report imports no torch (scoring a missing heatmap, `write_html_reports` with ``score_missing``, does).
"""

from __future__ import annotations

from app.report_html.figures import colour_bar_png, confusion_png, roc_png
from app.report_html.load import (
    HospitalReport,
    Predictions,
    ReportError,
    hospital_folders,
    load_hospital,
    read_predictions,
)
from app.report_html.page import render, report_html
from app.report_html.scoring import score_held_out_slides, score_one_slide
from app.report_html.write import write_html_reports

__all__ = [
    "HospitalReport",
    "Predictions",
    "ReportError",
    "colour_bar_png",
    "confusion_png",
    "hospital_folders",
    "load_hospital",
    "read_predictions",
    "render",
    "report_html",
    "roc_png",
    "score_held_out_slides",
    "score_one_slide",
    "write_html_reports",
]
