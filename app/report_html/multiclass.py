"""The HTML report of one hospital whose model tells more than two classes (issue 51: Table 7 of FedSAF paper 001 on
Fashion-MNIST, 10 classes): `render_classes`, from a `ClassReport`.

What applies to such a model (`app.evaluation.classes`): on the hospital's own test split (paper 001, Sec. 5), its
accuracy (a tile's class is the one of highest probability) and its macro one-vs-rest AUC over the classes present,
next to the engine's own last-round figures; the same two over the rounds (``metrics.jsonl``); the confusion matrix
by class. The binary task's verdict, threshold, sensitivity and specificity, ROC curve, example calls, slide calls and
heatmaps do not apply, and the page says so in one sentence instead of showing them. Settings and dataset hash as in
the binary report. Self-contained like it: inline PNGs with alt text, no scripts, no links. Imports ``load``,
``figures`` and ``parts`` of this package (docs/design.md, "Layout and layers").
"""

from __future__ import annotations

from typing import Any

from app import slide_view
from app.evaluation.classes import class_accuracy, class_confusion, macro_auc, not_applicable
from app.report_html.figures import rounds_png
from app.report_html.load import ClassReport, _config_dataset
from app.report_html.parts import _closing, _e, _figure_table, _fmt, _img, _opening

BINARY_NOTIONS = (
    "the verdict, the threshold with its sensitivity and specificity, the ROC curve, example calls, slide calls and "
    "heatmaps"
)
SHOWN_INSTEAD = "Shown instead: accuracy, the macro one-vs-rest AUC and the confusion matrix over its classes."
AUC_MEANING = (
    "Macro one-vs-rest AUC: for each class present in the test split, the chance that the model gives a tile of that "
    "class a higher probability of it than a tile of another class; the mean over those classes (1 = perfect "
    "ranking, 0.5 = a coin toss)."
)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _metric_rows(rep: ClassReport, accuracy: float | None, auc: float | None) -> str:
    classes, labels = rep.predictions.classes, rep.predictions.labels
    counts = [int((labels == i).sum()) for i in range(len(classes))]
    present = [c for c, n in zip(classes, counts, strict=True) if n]
    rows = [
        (
            "Test tiles",
            "tiles",
            str(len(labels)),
            ", ".join(f"{n} of class {c}" for c, n in zip(classes, counts, strict=True) if n),
        ),
        (
            "Classes in the test split",
            "classes_present",
            f"{len(present)} of {len(classes)}",
            "the macro AUC averages over these; a class absent from the split has no AUC of its own",
        ),
        ("Accuracy", "accuracy", _fmt(accuracy), "share of tiles whose class of highest probability is their own"),
        ("Macro one-vs-rest AUC", "auc", _fmt(auc), AUC_MEANING),
    ]
    engine = rep.engine
    if engine:
        rows += [
            (
                f"Engine's test macro AUC, round {engine['round']}",
                "engine_auc",
                _fmt(_number(engine.get("test_auc"))),
                "metrics.jsonl (the federation's own evaluation)",
            ),
            (
                f"Engine's test accuracy, round {engine['round']}",
                "engine_acc",
                _fmt(_number(engine.get("test_acc"))),
                "metrics.jsonl (argmax over the classes)",
            ),
        ]
    return _figure_table(rows)


def _rounds(rep: ClassReport) -> str:
    """The hospital's test accuracy and macro AUC of every recorded round, as a figure and a table."""
    if not rep.rounds:
        return '<p class="note">metrics.jsonl records no round of this hospital yet.</p>'
    rounds = [int(r["round"]) for r in rep.rounds]
    accuracy = [_number(r.get("test_acc")) for r in rep.rounds]
    auc = [_number(r.get("test_auc")) for r in rep.rounds]
    alt = f"Hospital {rep.hospital}'s test accuracy and macro one-vs-rest AUC over rounds " + "; ".join(
        f"round {n}: accuracy {_fmt(a, 3)}, AUC {_fmt(u, 3)}" for n, a, u in zip(rounds, accuracy, auc, strict=True)
    )
    rows = "".join(
        f'<tr><td class="num">{n}</td><td class="num">{_fmt(a)}</td><td class="num">{_fmt(u)}</td></tr>'
        for n, a, u in zip(rounds, accuracy, auc, strict=True)
    )
    return (
        f'<div class="figs"><figure id="round-curves">{_img(rounds_png(rounds, accuracy, auc), alt)}'
        "<figcaption>The engine's own evaluation after each round (metrics.jsonl).</figcaption></figure>"
        '<table data-metric="rounds"><tr><th>round</th><th>accuracy</th><th>macro one-vs-rest AUC</th></tr>'
        f"{rows}</table></div>"
    )


def _confusion(rep: ClassReport) -> str:
    """The confusion matrix by class name: rows the truth, columns the class of highest probability."""
    classes = rep.predictions.classes
    matrix = class_confusion(rep.predictions.labels, rep.predictions.probs, len(classes))
    head = "".join(f'<th scope="col">called {_e(c)}</th>' for c in classes)
    rows = "".join(
        f'<tr><th scope="row">truly {_e(c)}</th>'
        + "".join(f'<td class="num" data-cell="{i},{j}">{int(matrix[i, j])}</td>' for j in range(len(classes)))
        + f'<td class="num">{int(matrix[i].sum())}</td></tr>'
        for i, c in enumerate(classes)
    )
    return (
        '<p class="note">How many test tiles of each true class (rows) the model called each class (columns: the '
        "class of highest probability); the diagonal holds the right calls.</p>"
        f'<table data-metric="confusion_matrix"><tr><th></th>{head}<th scope="col">tiles</th></tr>{rows}</table>'
    )


def render_classes(rep: ClassReport) -> str:
    """The report of one hospital of a multi-class run as a self-contained HTML document (module docstring)."""
    labels, probs = rep.predictions.labels, rep.predictions.probs
    accuracy, auc = class_accuracy(labels, probs), macro_auc(labels, probs)
    dataset = slide_view.card_dataset(rep.card, _config_dataset(rep))
    title = f"Hospital {rep.hospital} · run {rep.run.name}"
    count = len(rep.predictions.classes)
    parts = [
        _opening(title, dataset),
        f'<p class="warn" data-metric="not_applicable">{_e(not_applicable(count, BINARY_NOTIONS))} '
        f"{_e(SHOWN_INSTEAD)}</p>",
        f'<h2 id="metrics">Metrics over {count} classes</h2>',
    ]
    if auc is None:
        parts.append(
            '<p class="warn" role="alert">The test split holds one class only, so the macro AUC is undefined.</p>'
        )
    parts.append(_metric_rows(rep, accuracy, auc))
    parts.append('<h2 id="rounds">Over the rounds</h2>')
    parts.append(_rounds(rep))
    parts.append('<h2 id="confusion">Confusion matrix</h2>')
    parts.append(_confusion(rep))
    parts.append(_closing(rep, dataset))
    return "".join(parts)
