"""One self-contained HTML report per run and hospital: ``gastric-fl report --html`` and the Slide page's download.

What a clinician needs to judge one hospital's model (issue 12, "an export"), from the files the hospital owns
(``<run>/hospitals/client_XX/``: ``predictions.csv``, the model card ``model.json``, scored slides) and the run's
``config.toml``, ``summary.json`` and ``metrics.jsonl``: its metrics at the card's threshold, the verdict, the ROC
curve and confusion matrix, example tiles, slide calls and heatmaps, and the settings (docs/dashboard.md, "The
hospital's report: `gastric-fl report --html`"). A model of more than two classes (issue 51) gets the report of what
applies to it instead: accuracy, macro one-vs-rest AUC, the round curves and the confusion matrix by class, and one
sentence naming the binary notions that do not apply.

The package has one module per concern, and every public name is re-exported here:

- ``load``: reading a hospital's files into a `HospitalReport` (`load_hospital`, `read_predictions`,
  `hospital_folders`), or a multi-class one's into a `ClassReport` (`load_classes`; `load_report` picks);
  `ReportError` for a run or hospital the report cannot be made from;
- ``figures``: the PNGs (ROC curve, confusion matrix, round curves, colour bar, heatmaps and test tiles), colour-blind
  safe;
- ``parts``: what both reports share (style, escaping, inline images, the settings table);
- ``multiclass``: the multi-class report (`render_classes`);
- ``scoring``: scoring the hospital's test slides where the run did not (`score_held_out_slides`,
  `score_one_slide`; these import torch);
- ``page``: the HTML document (`render`, `report_html`);
- ``write``: `write_html_reports`, where the files go and how they are written safely.

Imports run one way (docs/design.md, "Layout and layers"): ``parts`` uses ``figures`` and ``load``; ``multiclass``
uses ``parts``, ``figures`` and ``load``; ``page`` uses ``multiclass``, ``parts``, ``figures`` and ``load``;
``scoring`` uses ``load``; ``write`` uses ``load``, ``scoring``, ``multiclass`` and ``page``; nothing but this file
and ``write`` imports ``page``. Building a binary report imports no torch (scoring a missing heatmap,
`write_html_reports` with ``score_missing``, does; a multi-class report's macro AUC is the hospital's own
`federation.hospital.evaluation.multiclass_auc`, which does).
"""

from __future__ import annotations

from app.report_html.figures import colour_bar_png, confusion_png, roc_png
from app.report_html.load import (
    ClassReport,
    HospitalReport,
    Predictions,
    ReportError,
    hospital_folders,
    load_classes,
    load_hospital,
    load_report,
    read_predictions,
)
from app.report_html.multiclass import render_classes
from app.report_html.page import render, report_html
from app.report_html.scoring import score_held_out_slides, score_one_slide
from app.report_html.write import write_html_reports

__all__ = [
    "ClassReport",
    "HospitalReport",
    "Predictions",
    "ReportError",
    "colour_bar_png",
    "confusion_png",
    "hospital_folders",
    "load_classes",
    "load_hospital",
    "load_report",
    "read_predictions",
    "render",
    "render_classes",
    "report_html",
    "roc_png",
    "score_held_out_slides",
    "score_one_slide",
    "write_html_reports",
]
