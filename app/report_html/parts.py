"""What both kinds of HTML report share: the style sheet, escaping and number formatting, inline images, and the
settings table (the model card's preprocessing, the run's ``config.toml`` and the dataset hash).

Used by ``page`` (the binary task's report) and ``multiclass`` (a model of more than two classes); imports only
``load`` and ``figures`` of this package (docs/design.md, "Layout and layers").
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.report_html.figures import _data_uri
from app.report_html.load import ClassReport, HospitalReport, _json_file
from federation.runfiles import HOSPITAL_FILE
from infra.formats import MANIFEST_FILE
from infra.provenance import intended_use

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1080px;margin:2rem auto;padding:0 1rem;
color:#1f2933;line-height:1.45}
h1{margin-bottom:.2rem}h2{margin-top:2rem;border-bottom:1px solid #d9dee3;padding-bottom:.2rem}
.lead{color:#52606d}table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d9dee3;padding:.25rem .6rem;
text-align:left;vertical-align:top}th{background:#f5f7fa}.num{text-align:right;font-variant-numeric:tabular-nums}
.warn{background:#fff4e5;border-left:4px solid #E69F00;padding:.5rem .8rem}.note{color:#52606d;font-size:.9rem}
.figs{display:flex;flex-wrap:wrap;gap:1.5rem}.tiles{display:flex;flex-wrap:wrap;gap:.6rem}
.use{font-weight:600;border:1px solid #1f2933;padding:.3rem .6rem;display:inline-block}
figure{margin:0}figcaption{font-size:.85rem;color:#52606d;max-width:28rem}
.tile img{width:112px;height:112px;image-rendering:pixelated;border:1px solid #d9dee3}.tile figcaption{width:112px}
pre{background:#f5f7fa;padding:.8rem;overflow-x:auto;font-size:.8rem}code{font-size:.9em}
.verdict{padding:.5rem .8rem;border-left:6px solid}.verdict.pass{background:#e6f4ef;border-color:#007a5a}
.verdict.review{background:#fff4e5;border-color:#b35c00}.verdict.fail{background:#fde8e4;border-color:#b3261e}
.verdict.cannot-judge{background:#eef1f4;border-color:#52606d}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "undefined" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _img(png: bytes, alt: str, width: int | None = None) -> str:
    size = f' width="{width}"' if width else ""
    return f'<img src="{_data_uri(png)}" alt="{_e(alt)}"{size}>'


def _settings(rep: HospitalReport | ClassReport, dataset: Path | None) -> str:
    card = rep.card
    pre = card.get("preprocess") or {}
    data = card.get("dataset") or {}
    digest = data.get("manifest_sha256") or rep.summary.get("dataset_sha256")
    hospital_json = _json_file(rep.folder / HOSPITAL_FILE, "it is rewritten when the run resumes")
    digest = digest or hospital_json.get("manifest_sha256")
    rows = [
        ("Run", rep.run.name),
        ("Status", rep.summary.get("status", "unknown")),
        ("Algorithm", (rep.config.get("strategy") or {}).get("name", "?")),
        ("Model", card.get("architecture") or (rep.config.get("model") or {}).get("name", "?")),
        ("Model round", card.get("round", rep.predictions.round)),
        (
            "nhead (layer units kept at the hospital)",
            card.get("nhead", (rep.config.get("strategy") or {}).get("nhead")),
        ),
        ("Head units", ", ".join(card.get("head_units") or []) or "none"),
        ("Input", f"{pre.get('input_size')} px, {pre.get('in_chans')} channel(s)" if pre else "unknown"),
        (
            "Tile",
            f"{pre.get('tile_px')} px at scale {pre.get('scale')}, grayscale {pre.get('grayscale')}" if pre else "",
        ),
        ("Normalisation", f"mean {pre.get('mean')}, std {pre.get('std')}" if pre else ""),
        ("Dataset", data.get("path") or (dataset if dataset else "unknown")),
    ]
    body = "".join(f'<tr><th scope="row">{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in rows)
    body += (
        f'<tr><th scope="row">Dataset hash (sha256 of {MANIFEST_FILE})</th>'
        f'<td><code data-metric="dataset_sha256">{_e(digest or "unknown")}</code></td></tr>'
    )
    return f"<table>{body}</table><h3>config.toml</h3><pre>{_e(rep.config_text)}</pre>"


def _closing(rep: HospitalReport | ClassReport, dataset: Path | None) -> str:
    """The end of every report page: the settings and data (`_settings`), the notes, where and when it was written."""
    parts = ['<h2 id="settings">Settings and data</h2>', _settings(rep, dataset)]
    if rep.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in rep.notes) + "</ul>")
    written = datetime.now(UTC).replace(microsecond=0).isoformat()
    parts.append(
        f'<p class="note">Written {written} by <code>gastric-fl report --html</code> from {_e(rep.folder)} '
        "(predictions.csv, model.json) and the run's config.toml, summary.json and metrics.jsonl.</p>"
    )
    parts.append("</body></html>\n")
    return "".join(parts)


def _figure_table(rows: Sequence[tuple[str, str, str, str]]) -> str:
    """A report's table of figures: per row its name, its ``data-metric`` key, its value and where it comes from."""
    body = "".join(
        f'<tr><th scope="row">{_e(name)}</th><td class="num" data-metric="{key}">{_e(value)}</td>'
        f"<td>{_e(meaning)}</td></tr>"
        for name, key, value, meaning in rows
    )
    return f"<table><tr><th>figure</th><th>value</th><th>meaning</th></tr>{body}</table>"


def _opening(title: str, dataset: Path | None) -> str:
    """The start of every report page: the document head, the title, the intended use and what the page shows."""
    return "".join(
        [
            '<!doctype html><html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)} · gastric-fl report</title><style>{STYLE}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            f'<p class="use" data-metric="intended_use">{_e(intended_use(dataset))}</p>',
            '<p class="lead">How this hospital\'s own model (the shared layers as deployed plus its own head) does on '
            "the hospital's held-out test tiles, which it never trained on.</p>",
        ]
    )
