"""Scoring a hospital's slides for its HTML report, where the run left them unscored.

`score_held_out_slides` scores the hospital's held-out test slides into ``slides.csv`` as ``gastric-fl predict``
does (`app.held_out.score_held_out`: a deployed hospital's run ends on its own machine), and `score_one_slide`
scores one test slide (an abnormal one with most tiles, if any) into the Slide page's cache so that the report has
a heatmap (`app.slide_view`). Both import torch when called, which is why only `write_html_reports` with
``score_missing`` calls them; both return why not as one line instead of raising, since a failure only costs the
report its slide figures (docs/dashboard.md, "The hospital's report: `gastric-fl report --html`"). Imports only
``load`` of this package (docs/design.md, "Layout and layers").
"""

from __future__ import annotations

from app import slide_view
from app.report_html.load import HospitalReport, _config_dataset


def score_held_out_slides(rep: HospitalReport) -> str | None:
    """Score the hospital's test slides into ``slides.csv`` (`app.held_out.score_held_out`, predict's code) when
    the run did not (a deployment); returns why not when it cannot (the report then groups its test tiles)."""
    from app.held_out import score_held_out

    try:
        score_held_out(rep.folder, _config_dataset(rep))
    except Exception as exc:  # any failure only costs the slide figures; the reason goes into the report
        return f"test slides not scored as predict scores them: {slide_view.problem_line(exc, rep.folder)}"
    return None


def score_one_slide(rep: HospitalReport) -> str | None:
    """Score one test slide of the hospital (an abnormal one with most tiles, if any) for the report's heatmap.

    Returns why not when it cannot (no bundle, no raw slides, a bundle that does not fit): the report then says so.
    """
    if any(e.name.startswith(slide_view.TEST_PREFIX) for e in slide_view.scored_entries(rep.folder)):
        return None
    if not rep.card:
        return "no model card, so no slide could be scored"
    try:
        slides = slide_view.listed_slides(rep.card, slide_view.card_dataset(rep.card, _config_dataset(rep)))
        slide = max(slides, key=lambda s: (s.label == "abnormal", s.tiles))
        slide_view.score(rep.folder, slide.path, slide_view.slide_entry(rep.folder, slide))
    except Exception as exc:  # any failure only costs the heatmap; the reason goes into the report
        return f"no slide heatmap: {slide_view.problem_line(exc, rep.folder)}"
    return None
