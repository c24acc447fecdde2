"""One hospital's report as a self-contained HTML document: `render` (from a `HospitalReport`) and `report_html`.

What a clinician needs to judge one hospital's model (docs/dashboard.md, "The hospital's report: `gastric-fl
report --html`"):

* the metrics of its own test split (FedSAF paper 001, Sec. 5: each client's model on its own test split): AUC
  (threshold-free), and accuracy, sensitivity and specificity at the card's decision threshold (``P(abnormal) >=
  threshold`` calls a tile abnormal, `models.bundle.decision_counts`), next to the engine's own last-round figures;
* the verdict against the floor (`app.evaluation.verdict.judge`, the one judgement every page shows);
* the ROC curve with the operating point, the confusion matrix at the threshold, one plain sentence for each;
* example test tiles: true and false positives and negatives, the most confident first;
* every test slide's call, and heatmaps of scored slides (`app.slide_view`: the Slide page's results, or one test
  slide scored for the command), with their slide-level figures;
* the dataset's shortcut probe, and the settings: the model card's preprocessing and the run's ``config.toml``,
  and the dataset hash (sha256 of ``manifest.csv`` recorded when the run started).

Every image is an inline base64 PNG with alt text (drawn by ``figures``); there are no scripts, style sheets or
links to anything outside the file. Building a page reads what is on disk (``load``) and scores nothing, so it
imports no torch. `report_html` hands a model of more than two classes to
`app.report_html.multiclass.render_classes`. Only the package's ``__init__`` and ``write`` import this module
(docs/design.md, "Layout and layers").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from app import slide_prepared, slide_view
from app.colour_scale import words as colour_words
from app.report_html.figures import _downscaled_png, _tile_png, colour_bar_png, confusion_png, roc_png
from app.report_html.load import CLASS_NAMES, ClassReport, HospitalReport, _config_dataset, load_report
from app.report_html.multiclass import render_classes
from app.report_html.parts import _closing, _e, _figure_table, _fmt, _img, _opening
from models.decision import NO_DESCRIPTION, interval_text, outcome, slide_of_tile, slide_stem, weak_caveat

if TYPE_CHECKING:
    from app.evaluation.verdict import Floor

EXAMPLES_PER_GROUP = 4
TARGET_SENSITIVITY = 0.9  # the Hospital page's default target
HEATMAPS_SHOWN = 3
HEATMAP_MAX_SIDE = 720

EXPLAIN = {
    "auc": (
        "AUC: the chance that the model gives a randomly chosen abnormal tile a higher probability than a randomly "
        "chosen normal one (1 = perfect ranking, 0.5 = a coin toss). It does not depend on the threshold."
    ),
    "roc": (
        "ROC curve: each point is one threshold, plotting the share of abnormal tiles found (sensitivity) against "
        "the share of normal tiles wrongly flagged (1 - specificity); the dot is the model's threshold."
    ),
    "confusion": (
        "Confusion matrix: how many test tiles of each true class the model called normal or abnormal at the "
        "threshold; the diagonal holds the right calls."
    ),
    "sensitivity": "Sensitivity: the share of abnormal tiles the model calls abnormal (missed cancer lowers it).",
    "specificity": "Specificity: the share of normal tiles the model calls normal (false alarms lower it).",
}


def _metrics(rep: HospitalReport, floor: Floor | None = None) -> dict[str, Any]:
    """Counts and rates at the card's threshold, the ROC curve, the threshold reaching the floor's sensitivity and
    the verdict against ``floor`` (the default floor, sensitivity `TARGET_SENSITIVITY`, when none is given: the
    dashboard passes the one set on screen, ``report --html`` its ``--floor`` and ``--min-slides``).

    The operating point, the target threshold and the warning are the Hospital page scorecard's own functions
    (`app.evaluation`), so the report and the page agree word for word.
    """
    from app.evaluation.metrics import confusion, roc
    from app.evaluation.verdict import Floor, judge
    from app.evaluation.words import auc_warning, target_warning

    labels, probs = rep.predictions.labels, rep.predictions.probs
    frame = pd.DataFrame({"label": labels, "prob_abnormal": probs, "path": rep.predictions.paths})
    val = rep.val_predictions
    val_frame = (
        None if val is None else pd.DataFrame({"label": val.labels, "prob_abnormal": val.probs, "path": val.paths})
    )  # the paths name the slides, which the threshold's margin counts (`app.evaluation.threshold.bounded_threshold`)
    floor = floor or Floor(sensitivity=TARGET_SENSITIVITY)
    judged = judge(
        rep.hospital, frame, rep.threshold, _threshold_source(rep), rep.card.get("threshold_split") or "", floor,
        val_frame, rep.held_out,
    )  # fmt: skip
    score = judged.score
    matrix = confusion(labels, probs, rep.threshold)
    point, target = score.point, score.target  # the scorecard's own operating point and target threshold
    curve = roc(labels, probs)  # the curve itself, for its figure (the score keeps only its AUC)

    def rate(value: float) -> float | None:
        return None if math.isnan(value) else value

    return {
        "matrix": matrix,
        "curve": curve,
        "tiles": len(labels),
        "abnormal": point.abnormal,
        "normal": point.normal,
        "auc": curve.auc,
        "accuracy": rate(point.accuracy),
        "sensitivity": rate(point.sensitivity),
        "specificity": rate(point.specificity),
        "tp": point.tp,
        "fn": point.fn,
        "tn": point.tn,
        "fp": point.fp,
        "target": target,
        "sensitivity_ci": interval_text(point.sensitivity_interval),
        "specificity_ci": interval_text(point.specificity_interval),
        "score": score,
        "floor": floor,
        "verdict": judged.verdict,
        "warning": " ".join(
            w
            for w in (
                auc_warning(curve.auc, point),
                target_warning(point, target, score.unreachable),
            )
            if w
        )
        or None,
    }


SLIDES_MEANING = "the slides the test tiles come from; tiles of one slide are not independent"
AUC_CI = "percentile bootstrap resampling whole slides (2000 resamples, fixed seed), since tiles of a slide go together"
WILSON = (
    "Wilson score interval over this hospital's test tiles; tiles of one slide are not independent, so the true "
    "uncertainty is wider"
)


def _warning(m: dict[str, Any]) -> str | None:
    """The scorecard's warning (a high AUC over a poor operating point), else a note on a one-class split or an AUC
    near chance."""
    auc = m["auc"]
    if m["warning"]:
        return str(m["warning"])
    if auc is None:
        return "The test split holds only one class, so AUC and one of sensitivity/specificity are undefined."
    if auc < 0.6:
        return f"AUC {auc:.3f} is close to chance (0.5) or below: this model does not separate the classes."
    return None


VERDICT_MARK = {"pass": "✔ PASS", "review": "◆ REVIEW", "fail": "✖ FAIL", "cannot judge": "? CANNOT JUDGE"}


def _threshold_source(rep: HospitalReport) -> str:
    return str(rep.card.get("threshold_source") or "the default 0.5") if rep.card else "the default 0.5"


def _lowered(floor: Any) -> str:
    """`` at floor 0.70 (below 0.90)`` after the verdict's word when the floor is below the default, as every
    dashboard badge says it (`app.evaluation.tables.verdict_word`)."""
    from app.evaluation.verdict import DEFAULT_FLOOR

    return f" at floor {floor.sensitivity:.2f} (below {DEFAULT_FLOOR:.2f})" if floor.lowered else ""


def _verdict(m: dict[str, Any]) -> str:
    """The verdict against the report's floor (`app.evaluation.verdict.judge`, the one judgement every page
    shows), icon + word + colour + the reason, and the floor named."""
    verdict, floor = m["verdict"], m["floor"]
    kind = verdict.kind.replace(" ", "-")
    return (
        f'<p class="verdict {kind}" data-metric="verdict" data-verdict="{_e(verdict.kind)}">'
        f"<strong>{_e(VERDICT_MARK[verdict.kind])}{_e(_lowered(floor))}</strong> {_e(verdict.reason)} "
        f'<span class="note" data-metric="floor" data-sensitivity="{floor.sensitivity:.2f}" '
        f'data-min-slides="{floor.min_slides}" data-specificity="{floor.specificity:.2f}">(the floor: sensitivity '
        f"at least {floor.sensitivity:.2f} at the hospital's threshold, at least {floor.min_slides} test slides, "
        f"review below specificity {floor.specificity:.2f}; set on the dashboard's Verdict page, or with "
        "gastric-fl report --html --floor and --min-slides)</span></p>"
    )


def _outcome_words(label: int, called_abnormal: bool) -> str:
    """`models.decision.MISSED_CANCER` or `FALSE_ALARM` (the words every page and ``predict`` use), or that the call
    agrees with the annotation."""
    truth, call = CLASS_NAMES[label], "abnormal" if called_abnormal else "normal"
    return outcome(truth, call) or "agrees with the annotation"


def _held_out_flags(rep: HospitalReport) -> str:
    """The held-out slides reported UNFAMILIAR or normal with a focus above the threshold (`app.held_out`), or the
    bundle's lack of a tissue description, as a note; empty when there is nothing to say."""
    slides = rep.held_out
    text = "" if slides is None else slides.flags_text().strip()
    return f'<p class="note" data-metric="slide_flags">{_e(text)}</p>' if text else ""


def _slide_table(rep: HospitalReport, m: dict[str, Any]) -> str:
    """Every test slide: its name (from prepare's tile names), truth, score (the mean of its k highest tile
    probabilities) and call at the threshold."""
    slides = m["score"].slide_set
    if slides is None:
        return '<p class="note">The tile names do not say which slide they come from: no slide-level results.</p>'
    names = {}
    for path in rep.predictions.paths:
        key = slide_of_tile(path)
        if key is not None and key not in names:
            names[key] = slide_stem(path)
    called = slides.called(rep.threshold)
    rows = "".join(
        f'<tr><td>{_e(names.get(key, key))}</td><td>{CLASS_NAMES[int(label)]}</td><td class="num">{int(tiles)}</td>'
        f'<td class="num">{score:.3f}</td><td>{"abnormal" if call else "normal"}</td>'
        f"<td>{_e(_outcome_words(int(label), bool(call)))}</td></tr>"
        for key, label, tiles, score, call in zip(
            slides.keys, slides.labels, slides.tiles, slides.scores, called, strict=True
        )
    )
    return (
        f'<p class="note">Slide calls at threshold {rep.threshold:.2f} ({_e(_threshold_source(rep))}): '
        f"{_e(slides.rule)}.</p>"
        '<table data-metric="slide_calls"><tr><th>test slide</th><th>truth</th><th>tiles</th>'
        f"<th>mean of its {slides.k} highest tile probabilities</th><th>call</th><th></th></tr>{rows}</table>"
    )


def _metric_rows(rep: HospitalReport, m: dict[str, Any]) -> str:
    from app.evaluation.tables import FOCUS_SLIDES, UNFAMILIAR_SLIDES, flag_counts

    engine = rep.engine
    score = m["score"]
    slides = score.slide_point
    rows = [
        ("Test slides", "slides", "unknown" if score.slides is None else str(score.slides), SLIDES_MEANING),
        ("Test tiles", "tiles", str(m["tiles"]), f"{m['abnormal']} abnormal, {m['normal']} normal"),
        ("AUC", "auc", _fmt(m["auc"]), EXPLAIN["auc"]),
        ("AUC, 95% interval", "auc_ci", interval_text(score.auc_interval) or "undefined", AUC_CI),
        ("Accuracy", "accuracy", _fmt(m["accuracy"]), "share of tiles called right at the threshold"),
        ("Sensitivity", "sensitivity", _fmt(m["sensitivity"]), EXPLAIN["sensitivity"]),
        ("Sensitivity, 95% interval", "sensitivity_ci", m["sensitivity_ci"] or "undefined", WILSON),
        ("Specificity", "specificity", _fmt(m["specificity"]), EXPLAIN["specificity"]),
        ("Specificity, 95% interval", "specificity_ci", m["specificity_ci"] or "undefined", WILSON),
        (
            "Threshold",
            "threshold",
            f"{rep.threshold:.4g}",
            f"P(abnormal) at or above it calls a tile abnormal; from {_threshold_source(rep)}",
        ),
    ]
    if slides is not None and score.slide_set is not None:
        rule = score.slide_set.rule
        rows += [
            (
                "Slide sensitivity",
                "slide_sensitivity",
                _fmt(None if math.isnan(slides.sensitivity) else slides.sensitivity, 3),
                f"{slides.tp} of {slides.abnormal} abnormal slides called abnormal ({rule})",
            ),
            (
                "Slide specificity",
                "slide_specificity",
                _fmt(None if math.isnan(slides.specificity) else slides.specificity, 3),
                f"{slides.tn} of {slides.normal} normal slides called normal",
            ),
            (
                "Slide AUC",
                "slide_auc",
                _fmt(score.slide_auc, 3),
                f"AUC of the slides' scores (each the mean of its {score.slide_set.k} highest tile probabilities)",
            ),
        ]
    counts = flag_counts(score)  # as the scorecard, the Verdict page and gastric-fl report count them
    rows += [
        (
            "Unfamiliar test slides",
            "unfamiliar_slides",
            counts[UNFAMILIAR_SLIDES],
            "held-out test slides with more than half their tissue unlike this hospital's own: reported UNFAMILIAR, "
            "do not rely on their calls",
        ),
        (
            "Test slides with a focus",
            "focus_slides",
            counts[FOCUS_SLIDES],
            "held-out test slides called normal that hold a tile at or above the threshold: review them",
        ),
    ]
    target = m["target"]
    if target is not None:
        rows.append(
            (
                f"Threshold for sensitivity {target.target:.2f}",
                "target_threshold",
                f"{target.threshold:.4f}",
                f"the highest threshold at which the lower end of the 95% interval of the sensitivity reaches "
                f"{target.target:.2f}{' on the validation split' if target.split == 'validation' else ''}; on test "
                f"there: sensitivity {_fmt(target.point.sensitivity, 3)}, specificity "
                f"{_fmt(target.point.specificity, 3)}",
            )
        )
    if engine:
        auc = engine.get("test_auc")
        acc = engine.get("test_acc")
        rows += [
            (
                f"Engine's test AUC, round {engine['round']}",
                "engine_auc",
                _fmt(float(auc)) if isinstance(auc, int | float) else "undefined",
                "metrics.jsonl (the federation's own evaluation)",
            ),
            (
                f"Engine's test accuracy, round {engine['round']}",
                "engine_acc",
                _fmt(float(acc)) if isinstance(acc, int | float) else "undefined",
                "metrics.jsonl (argmax of the two classes)",
            ),
        ]
    return _figure_table(rows)


def _examples(rep: HospitalReport, dataset: Path | None) -> str:
    if dataset is None:
        return '<p class="note">The prepared dataset of this run is not on this machine, so no tile is shown.</p>'
    labels, probs, paths = rep.predictions.labels, rep.predictions.probs, rep.predictions.paths
    called = probs >= rep.threshold
    groups = [
        ("True positives", "abnormal, called abnormal", (labels == 1) & called, -probs),
        ("False negatives", "abnormal, called normal (missed)", (labels == 1) & ~called, probs),
        ("False positives", "normal, called abnormal (false alarm)", (labels == 0) & called, -probs),
        ("True negatives", "normal, called normal", (labels == 0) & ~called, probs),
    ]
    parts = []
    for title, meaning, chosen, order in groups:
        index = np.flatnonzero(chosen)
        index = index[np.argsort(order[index], kind="stable")][:EXAMPLES_PER_GROUP]
        figures = []
        for k in index:
            png = _tile_png(dataset, paths[k])
            truth = CLASS_NAMES[int(labels[k])]
            caption = f"P(abnormal) {probs[k]:.3f} · truly {truth}"
            if png is None:
                figures.append(f'<p class="note">{_e(paths[k])} is missing</p>')
                continue
            alt = f"{title[:-1]}: test tile {paths[k]}, truly {truth}, P(abnormal) {probs[k]:.3f}"
            figures.append(f'<figure class="tile">{_img(png, alt)}<figcaption>{_e(caption)}</figcaption></figure>')
        content = "".join(figures) if figures else '<p class="note">none</p>'
        parts.append(f'<h3>{_e(title)} ({int(chosen.sum())}): {_e(meaning)}</h3><div class="tiles">{content}</div>')
    return "".join(parts)


def _test_first(entries: list[Path]) -> list[Path]:
    """Cache entries of test slides first (newest first within each kind), uploads after them."""
    return sorted(entries, key=lambda e: not e.name.startswith(slide_view.TEST_PREFIX))


def _heatmaps(rep: HospitalReport) -> str:
    entries = _test_first(slide_view.scored_entries(rep.folder))[:HEATMAPS_SHOWN]
    if not entries:
        return (
            '<p class="note">No slide has been scored with this model yet: open the Slide page of the dashboard, '
            "or run <code>gastric-fl report --html</code>, which scores one test slide.</p>"
        )
    parts = []
    for entry in entries:
        scored = slide_view.load(entry)
        if scored is None or not scored.overlay.is_file():
            continue
        try:
            png, width, _ = _downscaled_png(scored.overlay, HEATMAP_MAX_SIDE)
        except ValueError:
            continue
        s = scored.summary
        truth = s.get("ground_truth") or {}
        test = entry.name.startswith(slide_view.TEST_PREFIX)
        name = Path(str(s.get("file") or s.get("slide"))).name if test else slide_view.slide_name(scored)
        kind = "test slide" if test else "UPLOADED, not one of the hospital's test slides"
        threshold = float(s.get("threshold", rep.threshold))
        share = s.get("unfamiliar_share")
        said = outcome(str(s.get("truth") or ""), str(s.get("call") or ""))
        figures = [
            f"called {s.get('call', 'unknown')} at threshold {threshold:.2f} ({s.get('threshold_source') or 'card'})"
            + (f", reported as {s['reported']}" if s.get("reported") not in (None, s.get("call")) else "")
            + (f": {said}" if said else ""),
            (
                str(s.get("tissue") or NO_DESCRIPTION)
                if share is None
                else f"{100 * float(share):.0f}% of the tiles unlike this hospital's tissue (unfamiliar, hatched grey)"
                + (f" ({caveat.rstrip('.')})" if (caveat := weak_caveat(s)) else "")
            ),
            f"{s.get('tiles')} tiles",
            f"max P(abnormal) {_fmt(s.get('max_probability'), 3)}",
            f"mean of the {s.get('top_k')} highest tile probabilities {_fmt(s.get('top_k_mean'), 3)}",
            f"{100 * float(s.get('abnormal_area_fraction', 0.0)):.1f}% of the tissue scored lies under tiles at or "
            "above the threshold",
        ]
        mine = slide_prepared.tiles_of_slide(list(rep.predictions.paths), name) if test else None
        if mine is not None:  # a test slide: its prepared test tiles, the ones the verdict and the scorecard count
            from app.evaluation.metrics import operating_point

            point = operating_point(rep.predictions.labels[mine], rep.predictions.probs[mine], threshold)
            sens = point.sensitivity if point.abnormal else None
            spec = point.specificity if point.normal else None
            figures.append(
                f"tile sensitivity {_fmt(sens, 3)}, specificity {_fmt(spec, 3)} (its {point.abnormal + point.normal} "
                "prepared test tiles, as the verdict counts them)"
            )
        elif truth:
            figures.append(
                f"tile sensitivity {_fmt(truth.get('sensitivity'), 3)}, specificity {_fmt(truth.get('specificity'), 3)}"
            )
        outline = " The annotation is outlined in white." if (s.get("overlay") or {}).get("outline") else ""
        alt = (
            f"Heatmap of P(abnormal) over {kind} {name}: tiles at or above the threshold {threshold:.2f} coloured "
            f"({colour_words(threshold)}); below the threshold: left uncoloured.{outline}"
        )
        colour = (
            f" Colour: P(abnormal) where it is at least the threshold {threshold:.2f} (▲ on the bar; "
            f"{colour_words(threshold)}); below the threshold: left uncoloured (shown light grey on the bar)."
        )
        caption = f"{name} ({kind}, {s.get('width')} x {s.get('height')} px): " + "; ".join(figures) + "." + colour
        bar = colour_bar_png(threshold)
        bar_alt = (
            f"Colour bar of P(abnormal): below the threshold {threshold:.2f} left uncoloured (shown light grey on the "
            f"bar), {colour_words(threshold)}"
        )
        parts.append(
            f'<figure data-slide="{_e(name)}" data-kind="{"test" if test else "upload"}">'
            f"{_img(png, alt, min(width, 520))}<br>{_img(bar, bar_alt, 420)}"
            f"<figcaption>{_e(caption)}{_e(outline)}</figcaption></figure>"
        )
    return f'<div class="figs">{"".join(parts)}</div>' if parts else '<p class="note">No readable heatmap.</p>'


def _shortcut(dataset: Path | None) -> str:
    """The dataset's shortcut probe (prepare.json): could a model score well here without looking at tissue?"""
    from app.datasets import load_prepare_json, shortcut_probe

    if dataset is None:
        return '<p class="note">The prepared dataset is not on this machine: its shortcut probe cannot be shown.</p>'
    try:
        probe = shortcut_probe(load_prepare_json(dataset))
    except ValueError as exc:  # DashboardError is a ValueError: a damaged prepare.json
        return f'<p class="note">{_e(exc)}</p>'
    if probe is None:
        return (
            '<p class="note">This dataset was prepared before prepare measured shortcuts: prepare it again to see '
            "whether pixel statistics alone separate its classes.</p>"
        )
    parts = []
    if probe.departure:
        parts.append(f'<p class="warn" role="alert">Departure from raw tissue: {_e(probe.departure)}.</p>')
    if probe.warning:
        parts.append(f'<p class="warn" role="alert" data-metric="shortcut_warning">{_e(probe.warning)}</p>')
    parts.append(
        '<p class="note">AUC of one pixel statistic used alone as the score (0.5: tells nothing; 1.0: separates '
        "the classes perfectly), pooled over the hospitals of the dataset.</p>"
    )
    columns = list(probe.table.columns)
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in columns)
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{_e(v if isinstance(v, str) else ('n/a' if v is None or v != v else f'{v:.3f}'))}</td>" for v in row
        )
        + "</tr>"
        for row in probe.table.itertuples(index=False)
    )
    parts.append(f'<table data-metric="shortcut_probe"><tr>{head}</tr>{rows}</table>')
    return "".join(parts)


def render(rep: HospitalReport, floor: Floor | None = None) -> str:
    """The report of one hospital as a self-contained HTML document, judged against ``floor`` (default: the
    default floor)."""
    m = _metrics(rep, floor)
    dataset = slide_view.card_dataset(rep.card, _config_dataset(rep))
    title = f"Hospital {rep.hospital} · run {rep.run.name}"
    warning = _warning(m)
    parts = [
        _opening(title, dataset),
        _verdict(m),
        f'<h2 id="metrics">Metrics at threshold {rep.threshold:.2f}</h2>',
    ]
    if warning:
        parts.append(f'<p class="warn" role="alert">{_e(warning)}</p>')
    parts.append(_metric_rows(rep, m))
    parts.append('<h2 id="roc">ROC curve and confusion matrix</h2><div class="figs">')
    if m["auc"] is not None:
        sens = m["sensitivity"] if m["sensitivity"] is not None else 0.0
        spec = m["specificity"] if m["specificity"] is not None else 1.0
        roc = roc_png(m["curve"].fpr, m["curve"].tpr, (1.0 - spec, sens), m["auc"])
        alt = (
            f"ROC curve of hospital {rep.hospital}: AUC {m['auc']:.3f}; at threshold {rep.threshold:.2f} sensitivity "
            f"{_fmt(m['sensitivity'], 3)} and specificity {_fmt(m['specificity'], 3)}"
        )
        parts.append(f'<figure id="roc-curve">{_img(roc, alt)}<figcaption>{_e(EXPLAIN["roc"])}</figcaption></figure>')
    else:
        parts.append('<p class="note">No ROC curve: the test split holds one class.</p>')
    matrix = confusion_png(m["matrix"], rep.threshold)
    alt = (
        f"Confusion matrix at threshold {rep.threshold:.2f}: {m['tn']} true negatives, {m['fp']} false positives, "
        f"{m['fn']} false negatives, {m['tp']} true positives"
    )
    parts.append(
        f'<figure id="confusion-matrix">{_img(matrix, alt)}<figcaption>{_e(EXPLAIN["confusion"])}</figcaption></figure>'
    )
    parts.append("</div>")
    parts.append('<h2 id="examples">Example test tiles</h2>')
    parts.append('<p class="note">The most confident calls of each kind first; errors are the ones to read.</p>')
    parts.append(_examples(rep, dataset))
    parts.append('<h2 id="slides">Slides</h2>')
    parts.append(_slide_table(rep, m))
    parts.append(_held_out_flags(rep))
    parts.append(_heatmaps(rep))
    parts.append('<h2 id="shortcut">Could a model score well here without looking at tissue?</h2>')
    parts.append(_shortcut(dataset))
    parts.append(_closing(rep, dataset))
    return "".join(parts)


def report_html(run_dir: Path, hospital: int | str, floor: Floor | None = None) -> str:
    """The self-contained HTML report of ``hospital`` (index or ``client_XX``) in ``run_dir``, from what is on disk:
    `render`, or `app.report_html.multiclass.render_classes` for a model of more than two classes.

    Heatmaps come from slides already scored for this model (the Slide page's results); nothing is scored here,
    so no torch is imported for the binary task. `ReportError` (one line) for a missing or damaged run or hospital.
    """
    rep = load_report(Path(run_dir), hospital)
    return render_classes(rep) if isinstance(rep, ClassReport) else render(rep, floor)
