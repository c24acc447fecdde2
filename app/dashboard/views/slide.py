"""Slide page: one hospital's model over a whole slide (issue 12, "a Slide page").

Pick a run, a hospital and one of its test slides (the slides ``prepare.json`` put in that hospital's test split),
or upload a slide. The hospital's exported model scores every tissue tile exactly as ``gastric-fl predict`` does
(`app.slide_view.score`; FedSAF paper 001 Sec. 4.2 for the tiling), once: the result is kept in the hospital's
folder, so a second visit draws it straight from disk. The page shows the probability heatmap (viridis) over the
slide with an opacity slider and the annotation's outline (a test slide's drawn from its prepared test tiles, the ones
its tile figures and the Verdict and Hospital pages count, `app.slide_prepared.on_prepared_tiles`; an upload's from
predict's grid; a caption says which), the slide-level summary (maximum, the mean of the k
highest tile probabilities, the share of the tissue called abnormal at the card's threshold; the slide call set against
the annotation, a miss or a false alarm said in words; tile sensitivity and specificity when there is one), and one
tile's image and probability, picked by clicking the heatmap or from the list. The hospital's HTML report
(`app.report_html`, also ``gastric-fl report --html``) is one click away.

Torch is imported only when a slide has to be scored, so the page's first content never waits for it. Every
problem (damaged card, missing dataset, unreadable slide, no tissue, a bundle that does not fit) is one line. An
upload is checked before it is kept (`app.slide_upload.check_upload`): a file that is not a PNG or TIFF slide, or whose
header declares more pixels than the page's limit (``gastric-fl dashboard --max-pixels``), is refused in a sentence
on the page naming the uploaded file and what to upload instead. The uploaders take any file, so that this sentence,
not only the browser's own mark on the file, says why a file is refused. An upload is shown under the name it was
uploaded as (`app.slide_view.slide_name`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import streamlit as st

from app import colour_scale, slide_prepared, slide_upload, slide_view
from app.dashboard import ui
from app.dashboard.slide_figure import file_stamp, heatmap_figure
from app.datasets import hospital_label
from app.evaluation.classes import not_applicable
from app.run_records import RunInfo
from federation.runfiles import METRICS_FILE, PREDICTIONS_FILE, SLIDES_FILE
from infra.formats import hospital_name
from models.decision import NO_DESCRIPTION, UNFAMILIAR_LIMIT, weak_caveat
from models.names import CARD_FILE
from pipeline.errors import PipelineError

TILE_DISPLAY_PX = 224
TILE_KEY = "slide_tile"
CHART_KEY = "slide_chart"

st.title("Slide")
st.caption(
    "One hospital's model over a whole slide: where it sees abnormal tissue, tile by tile. Scored once, "
    "kept in the hospital's folder."
)


@st.cache_resource(show_spinner=False, max_entries=2)
def _slide_pixels(path: str, stamp: float, limit: int) -> npt.NDArray[np.uint8]:
    """The full-resolution slide, decoded once per file version (tiles are cut from it), within the pixel limit."""
    from pipeline.images import read_bytes, read_rgb

    return read_rgb(read_bytes(Path(path)), path, limit)


@st.cache_data(show_spinner=False, max_entries=8)
def _report(run: str, hospital: int, stamp: tuple[float, ...], floor: tuple[float, int, float]) -> str:
    """The hospital's HTML report, judged against the floor set on screen (``floor``: sensitivity, minimum test
    slides, review specificity), rebuilt when its files or its scored slides change (``stamp``) or the floor does."""
    from app.evaluation.verdict import Floor
    from app.report_html import report_html

    return report_html(Path(run), hospital, Floor(*floor))


def _runs_with_models() -> list[RunInfo]:
    return [r for r in ui.all_runs() if slide_view.bundle_folders(r.path)]


def _on_click() -> None:
    """A click on the heatmap picks the tile under it (the point's ``customdata`` is the tile's index)."""
    state: Any = st.session_state.get(CHART_KEY)
    points = state["selection"]["points"] if state and state.get("selection") else []
    for point in points:
        index = point.get("customdata", point.get("point_index"))
        if isinstance(index, list):
            index = index[0]
        if isinstance(index, int | float):
            st.session_state[TILE_KEY] = int(index)
            return


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _grid_point(scored: slide_view.ScoredSlide) -> Any:
    """The operating point at the threshold of the tiles the heatmap is drawn from, when they are a test slide's
    prepared test tiles (`app.slide_prepared.on_prepared_tiles`: the tiles the Verdict and Hospital pages count), so
    that the tile figures count exactly the tiles the heatmap colours; ``None`` on predict's grid."""
    from app.evaluation.metrics import operating_point

    if scored.grid != slide_view.PREPARED_GRID:
        return None
    labels = np.array([int(t == "abnormal") for t in scored.truth], dtype=int)
    return operating_point(labels, scored.probability, scored.threshold)


def _tissue(s: dict[str, Any]) -> None:
    """The slide's unfamiliar share (`models.shift`), or why the bundle cannot say."""
    share = s.get("unfamiliar_share")
    if share is None:
        st.caption(str(s.get("tissue") or NO_DESCRIPTION) + ".")
        return
    limit = float(s.get("unfamiliar_limit") or UNFAMILIAR_LIMIT)
    text = (
        f"Unfamiliar tissue: {share:.0%} of the tiles ({s.get('unfamiliar_tiles')} of {s['tiles']}) are unlike this "
        f"hospital's training tissue, hatched grey on the heatmap; above {limit:.0%} the slide is reported "
        "UNFAMILIAR."
    )
    if caveat := weak_caveat(s):  # a description from few tiles: a low share says little
        text += f" {caveat}"
    if s.get("unfamiliar"):
        st.warning(text, icon=":material/help:")
    else:
        st.caption(text)


def _summary(
    scored: slide_view.ScoredSlide, label: str | None = None, coverage: float = 0.5, prepared: Any = None
) -> None:
    """The slide-level figures of predict's summary.json, two per row (a narrow column beside the heatmap).

    The slide call is set against the annotation (`app.slide_view.call_mark`): predict's ``truth`` (the slide has
    annotated abnormal tissue or not), else ``label`` (prepare's label of a test slide). ``coverage``: the share of
    a tile's tissue inside the annotation that makes it abnormal (the model card's tiling). ``prepared``: for a
    test slide, `_grid_point`'s operating point: its tile sensitivity and specificity are then the ones the
    Verdict and Hospital pages count (one tiling for the tile figures on every page), not the heatmap grid's."""
    s = scored.summary
    threshold = scored.threshold
    truth = s.get("ground_truth")
    call = s.get("call")
    if call is not None:
        source = s.get("threshold_source") or "the model card"
        rule = str(s.get("call_rule") or "")
        mark = ":red-background[**abnormal**]" if call == "abnormal" else ":blue-background[**normal**]"
        annotated = s.get("truth") if s.get("truth") in ("normal", "abnormal") else label
        icon, words = slide_view.call_mark(str(call), annotated)
        if icon in (":material/error:", ":material/warning:"):
            words = f"**{words}**"  # a miss or a false alarm, never shown with a tick
        reported = str(s.get("reported") or call)
        if s.get("unfamiliar"):  # never a bare normal or abnormal (issue 47)
            mark = f":gray-background[**{reported}**] (the model said {call})"
        elif s.get("focus"):
            mark = f":orange-background[**{reported}**]"
        st.markdown(f"{icon} Slide call: {mark} at threshold {threshold:.2f} ({source}) · {words}.")
        st.caption(f"The rule: {rule}.")
        _tissue(s)
    k = s["top_k"]
    figures = [
        (
            "Tiles scored",
            f"{s['tiles']}",
            f"the slide's tissue squares of {s['tile_size_px']} px, cut on the grid the training tiles were cut on "
            "(squares that are mostly white background are skipped)",
        ),
        ("Max P(abnormal)", f"{s['max_probability']:.3f}", "the probability of the most suspicious tile"),
        (
            f"Mean of top {k}",
            f"{s['top_k_mean']:.3f}",
            f"the mean of the {k} highest tile probabilities: the slide's score, called abnormal when it reaches "
            f"the threshold {threshold:.2f}",
        ),
        (
            "Abnormal tissue",
            f"{100 * s['abnormal_area_fraction']:.1f} %",
            f"of the area under the slide's tissue tiles (the tiles scored), the share under tiles with "
            f"P(abnormal) ≥ {threshold:.2f} (the model's threshold)",
        ),
    ]
    if prepared is not None:
        figures += [
            (
                "Tile sensitivity",
                _rate(None if not prepared.abnormal else prepared.sensitivity),
                f"of this slide's {prepared.abnormal} abnormal prepared test tiles, the share called abnormal at "
                f"{threshold:.2f}: the tiles the Verdict and Hospital pages count (n/a: none)",
            ),
            (
                "Tile specificity",
                _rate(None if not prepared.normal else prepared.specificity),
                f"of this slide's {prepared.normal} normal prepared test tiles, the share called normal (n/a: none)",
            ),
        ]
    elif truth:
        figures += [
            (
                "Tile sensitivity",
                _rate(truth["sensitivity"]),
                "annotated abnormal tiles the model calls abnormal (n/a: no abnormal tile on this slide)",
            ),
            (
                "Tile specificity",
                _rate(truth["specificity"]),
                "tiles outside the annotation the model calls normal (n/a: no normal tile on this slide)",
            ),
        ]
    for row in range(0, len(figures), 2):
        cols = st.columns(2)
        for col, (name, value, meaning) in zip(cols, figures[row : row + 2], strict=False):
            col.metric(name, value, help=meaning)
    st.caption(
        f"Mean of top {k}: the mean of the {k} highest tile probabilities, the slide's score. Abnormal tissue: of the "
        f"area under the slide's {s['tiles']} tissue tiles, the share under tiles with P(abnormal) ≥ {threshold:.2f}."
    )
    if prepared is not None:
        st.caption(
            f"Tile sensitivity and specificity: this slide's prepared test tiles ({prepared.tp} of {prepared.abnormal} "
            f"abnormal called abnormal, {prepared.fp} of {prepared.normal} normal called abnormal: "
            f"{prepared.tp + prepared.fp} tiles called abnormal), the tiles the Verdict and Hospital pages count and "
            "the heatmap shows."
        )
    elif truth:
        edge = truth["unlabelled_tiles"]
        st.caption(
            f"Against the annotation: {truth['abnormal_tiles']} abnormal and {truth['normal_tiles']} normal tiles. "
            f"A tile is abnormal when at least {coverage:.0%} of its tissue lies inside the annotation and normal "
            "when none does, as the training tiles were labelled"
            + (
                f"; {edge} {'tile lies' if edge == 1 else 'tiles lie'} partly inside it, less than that, and "
                "count in neither class."
                if edge
                else "."
            )
        )
    else:
        st.caption("No annotation (mask or SVG) for this slide, so no tile sensitivity or specificity.")


def _tile_panel(scored: slide_view.ScoredSlide, picked: int, names: dict[Path, str]) -> None:
    """The picked tile: its probability, the call at the threshold, and its pixels (with alt text)."""
    x, y, size = int(scored.xs[picked]), int(scored.ys[picked]), scored.size
    p = float(scored.probability[picked])
    called = "abnormal" if p >= scored.threshold else "normal"
    truth = scored.truth[picked] or ("on the annotation's edge" if scored.summary.get("ground_truth") else "unknown")
    st.metric("P(abnormal) of this tile", f"{p:.4f}", help=f"called {called} at threshold {scored.threshold:.2f}")
    try:
        pixels = _slide_pixels(str(scored.slide), file_stamp(scored.slide), slide_view.max_pixels())
        square = pixels[y : y + size, x : x + size]
        shown = cv2.resize(square, (TILE_DISPLAY_PX, TILE_DISPLAY_PX), interpolation=cv2.INTER_AREA)
        st.image(
            shown,
            caption=f"Tile at x {x}, y {y} ({size} px square) · P(abnormal) {p:.4f} · called {called} · truth: {truth}",
            alt=f"The slide's {size} pixel square at x {x}, y {y}; the model gives it P(abnormal) {p:.3f}",
            width="stretch",
        )
    except Exception as exc:  # the figures above stay useful without the picture
        st.error(slide_view.problem_line(exc, scored.slide, names))


def _show(
    scored: slide_view.ScoredSlide,
    key: str,
    names: dict[Path, str],
    label: str | None = None,
    coverage: float = 0.5,
    prepared: Any = None,
) -> None:
    """Everything about one scored slide: heatmap with opacity, slide summary, picked tile. ``names``: how to name
    the files of an upload's cache entry (`app.slide_upload.kept_names`): captions and messages show an upload by the
    name it was uploaded under. ``label``, ``coverage`` and ``prepared``: see `_summary`."""
    warning = scored.summary.get("warning")
    if warning:
        st.warning(slide_view.shown_text(str(warning), names), icon=":material/warning:")
    order = [int(i) for i in np.argsort(-scored.probability, kind="stable")]
    if st.session_state.get("_slide_shown") != key or st.session_state.get(TILE_KEY) not in order:
        st.session_state[TILE_KEY] = order[0]  # a new slide starts at its most suspicious tile
        st.session_state["_slide_shown"] = key
    chart, figures, tile = st.columns([2.3, 1.4, 1.1], gap="medium")
    with figures:
        _summary(scored, label, coverage, prepared)
        opacity = st.slider("Heatmap opacity", 0.0, 1.0, 0.5, 0.05, key="slide_opacity", help="0 shows the slide alone")
    with tile:
        picked = st.selectbox(
            "Tile (most suspicious first), or click one on the heatmap",
            order,
            format_func=lambda i: f"x {scored.xs[i]}, y {scored.ys[i]} · P {scored.probability[i]:.3f}",
            key=TILE_KEY,
        )
        _tile_panel(scored, int(picked), names)
    with chart:
        name = slide_view.slide_name(scored, names)
        outline = " The annotation is outlined in white." if scored.layer("outline") is not None else ""
        grid = _grid_words(scored)
        st.plotly_chart(
            heatmap_figure(scored, opacity, int(picked)),
            key=CHART_KEY,
            on_select=_on_click,
            selection_mode="points",
            config={"displaylogo": False, "scrollZoom": True},
            alt=(
                f"Heatmap of P(abnormal) over {name} ({scored.width} x {scored.height} px): tiles at or above the "
                f"threshold {scored.threshold:.2f} coloured ({colour_scale.words(scored.threshold)}); below "
                f"the threshold: left uncoloured.{outline} {grid}"
            ),
        )
        st.caption(
            f"{name}, {scored.width} x {scored.height} px"
            + ("" if scored.scale == 1.0 else f", drawn at {scored.scale:.0%}")
            + f". Colour: P(abnormal), the mean of the tiles covering each pixel, where it is at least the "
            f"threshold {scored.threshold:.2f} (▲ on the bar; {colour_scale.words(scored.threshold)}); "
            "below the threshold: left uncoloured (shown light grey on the bar)." + outline
        )
        st.caption(grid)


def _grid_words(scored: slide_view.ScoredSlide) -> str:
    """Which tiles the heatmap is drawn from, in one sentence, and where the unfamiliar marks come from."""
    hatched = scored.layer("unfamiliar") is not None
    if scored.grid == slide_view.PREPARED_GRID:
        return (
            f"Drawn from this test slide's {len(scored.xs)} prepared test tiles, placed by manifest.csv and scored in "
            "predictions.csv: the "
            "tiles the tile figures and the Verdict and Hospital pages count, so what is coloured is what is called "
            f"abnormal. The slide call and its score are predict's, on its grid of {scored.summary.get('tiles')} "
            f"tiles over the whole slide ({SLIDES_FILE})"
            + (
                "; the unfamiliar tissue (hatched grey) is marked on that grid, the only one the tissue description "
                "scores."
                if hatched
                else "."
            )
        )
    return (
        f"Drawn from predict's grid of {len(scored.xs)} tiles over the whole slide (an uploaded slide, or a test "
        "slide whose prepared test tiles are not on this machine)"
        + ("; the unfamiliar tissue is hatched grey." if hatched else ".")
    )


def _upload(folder: Path) -> tuple[Path | None, dict[Path, str]]:
    """The uploaders, and the uploaded slide once checked and kept in its cache entry under ``folder`` (else
    ``None``), with the names of the kept files as uploaded. A refusal is one sentence naming the uploaded file."""
    try:
        limit = slide_view.max_pixels()
    except (slide_view.SlideViewError, PipelineError) as exc:
        st.error(str(exc), icon=":material/error:")
        return None, {}
    cols = st.columns(2)
    # No type= filter: the browser's refusal of a filtered type is a mark on the file, not a sentence; the page
    # checks the type itself (check_upload) and says in words what it takes.
    picked_file = cols[0].file_uploader("Slide (PNG or TIFF)", key="slide_upload")
    picked_note = cols[1].file_uploader(
        "Its annotation, if any: a SEED mask (PNG) or a BOT SVG", key="slide_annotation"
    )
    st.caption(
        f"A slide is a PNG or TIFF image of at most {limit:,} pixels (`gastric-fl dashboard --max-pixels` sets the "
        f"limit; the default is 8192 x 8192) and {st.get_option('server.maxUploadSize')} MB."
    )
    if picked_file is None:
        st.info("Upload a slide to score it with this hospital's model.", icon=":material/upload:")
        return None, {}
    note_name = None if picked_note is None else picked_note.name
    try:
        data = picked_file.getvalue()
        slide_upload.check_upload(picked_file.name, data, limit, note_name)
        note = None if picked_note is None else (picked_note.name, picked_note.getvalue())
        slide_path = slide_upload.stage_upload(folder, picked_file.name, data, note)
    except (slide_view.SlideViewError, PipelineError, OSError) as exc:
        st.error(slide_view.problem_line(exc, Path(picked_file.name)), icon=":material/error:")
        return None, {}
    return slide_path, slide_upload.kept_names(slide_path.parent.parent, picked_file.name, note_name)


# --- the page ---------------------------------------------------------------------------------------------------


def _test_slides_line(folder: Path, hospital: int, card: dict[str, Any]) -> None:
    """One caption: the hospital's slide calls over all its test slides at the card's threshold, from
    ``slides.csv`` (`app.held_out`: each whole slide scored on predict's grid, as the Verdict and Hospital pages,
    the HTML report and ``predict`` count them), so the slide on screen is seen against the rest with the same
    count as everywhere else; said when the slides are not scored yet."""
    from app.evaluation.metrics import operating_point, roc
    from app.held_out import SlideCallsError, as_slides, read_slide_calls

    source = card.get("threshold_source") or "the default 0.5"
    try:
        slides = as_slides(read_slide_calls(folder / SLIDES_FILE))
    except SlideCallsError as exc:
        st.caption(f"{hospital_label(hospital)}'s test slides are not counted here: {exc}.")
        return
    if slides is None:
        return
    threshold = float(card.get("threshold", 0.5))
    point = operating_point(slides.labels, slides.scores, threshold)
    slide_auc = roc(slides.labels, slides.scores).auc
    auc = "" if slide_auc is None else f"; slide AUC {slide_auc:.3f}"
    st.caption(
        f"{hospital_label(hospital)}'s {len(slides.keys)} test slides at threshold {threshold:.2f} ({source}): "
        f"{point.tp} of {point.abnormal} abnormal slides called abnormal, {point.tn} of {point.normal} normal slides "
        f"called normal{auc}. {slides.rule.capitalize()}, each whole slide on the grid the Slide page scores "
        f"({SLIDES_FILE})."
    )


@ui.page_guard("Slide")
def _page() -> None:
    """Pickers, scoring (or the cached result), the slide view and the report download."""
    if not ui.all_runs():
        ui.no_runs_help()
        st.stop()
    ready = _runs_with_models()
    if not ready:
        st.info(
            "No run has an exported model yet: each hospital writes model.json and model.safetensors into its folder "
            "after every evaluated round. Start a run on the Federation page, or wait for its first round.",
            icon=":material/hourglass_top:",
        )
        st.stop()

    run_col, hospital_col, source_col = st.columns([1.6, 0.8, 1.3])
    with run_col:
        info = ui.pick_run(ready, "Run", key="slide_run", finished_first=True)
    if info is None:
        st.stop()
    ui.intended_use(info.dataset)
    folders = slide_view.bundle_folders(info.path)
    with hospital_col:
        hospital = int(st.selectbox("Hospital", list(folders), format_func=hospital_label, key="slide_hospital"))
    with source_col:
        source = st.radio(
            "Slide", ["A test slide of this hospital", "Upload a slide"], horizontal=True, key="slide_source"
        )
    folder = folders[hospital]
    try:
        card = slide_view.read_card_json(folder)
    except slide_view.SlideViewError as exc:
        st.error(str(exc))
        st.stop()
    classes = card.get("class_names") or []
    if len(classes) != 2 or card.get("positive_class", "abnormal") not in classes:
        st.info(
            f"{hospital_label(hospital)}: "
            + not_applicable(len(classes), "the Slide page's map of P(abnormal) and its slide call")
            + f" Its classes: {', '.join(map(str, classes[:5]))}{', ...' if len(classes) > 5 else ''}; its accuracy, "
            "macro AUC and confusion matrix are on the Hospital page and in gastric-fl report RUN --html.",
            icon=":material/info:",
        )
        st.stop()

    slide_path: Path | None = None
    entry: Path | None = None
    label: str | None = None
    slide_source = ""
    upload = False
    uploaded_names: dict[Path, str] = {}
    if source.startswith("A test"):
        try:
            slides = slide_view.listed_slides(card, slide_view.card_dataset(card, info.dataset))
        except slide_view.SlideViewError as exc:
            st.error(str(exc))
            slides = []
        if slides:
            chosen = st.selectbox(
                "Test slide",
                range(len(slides)),
                format_func=lambda i: (
                    f"{slides[i].source} · {slides[i].label or '?'} · {slides[i].tiles} training-grid tiles"
                ),
                key="slide_pick",
                help="The slides prepare put in this hospital's test split (prepare.json): the model never saw them.",
            )
            slide_path = slides[chosen].path
            slide_source = slides[chosen].source
            label = slides[chosen].label
            entry = slide_view.slide_entry(folder, slides[chosen])
            _test_slides_line(folder, hospital, card)
    else:
        upload = True
        slide_path, uploaded_names = _upload(folder)
        entry = None if slide_path is None else slide_path.parent.parent

    if slide_path is not None and entry is not None:
        scored = slide_view.load(entry)
        if scored is None:
            shown = uploaded_names.get(slide_path, slide_path.name)
            with st.spinner(f"Scoring every tile of {shown} with {hospital_label(hospital)}'s model…"):
                try:
                    scored = slide_view.score(folder, slide_path, entry, slide_view.max_pixels())
                except Exception as exc:  # one line on the page, never a traceback
                    st.error(slide_view.problem_line(exc, slide_path, uploaded_names), icon=":material/error:")
                    if upload:
                        slide_upload.discard(entry)
                    scored = None
        if scored is not None:
            tiling = card.get("tiling")
            coverage = float(tiling.get("abnormal_coverage", 0.5)) if isinstance(tiling, dict) else 0.5
            if not upload and slide_source:  # a test slide: drawn and counted on its prepared test tiles
                dataset = slide_view.card_dataset(card, info.dataset)
                scored = slide_prepared.on_prepared_tiles(scored, folder, dataset, slide_source) or scored
            prepared = _grid_point(scored)
            _show(scored, str(entry), uploaded_names or slide_upload.kept_names(entry), label, coverage, prepared)

    st.divider()
    try:
        files = (folder / PREDICTIONS_FILE, folder / CARD_FILE, info.path / METRICS_FILE)
        stamp = (
            *(file_stamp(f) for f in files),
            *(file_stamp(e / "view" / "view.json") for e in slide_view.scored_entries(folder)),
        )
        floor = ui.current_floor()
        report = _report(str(info.path), hospital, stamp, (floor.sensitivity, floor.min_slides, floor.specificity))
    except Exception as exc:  # the report is optional; its problem is one line
        st.caption(f"No report: {slide_view.problem_line(exc, folder)}")
    else:
        st.download_button(
            f"Download {hospital_label(hospital)}'s report (HTML)",
            data=report,
            file_name=f"{info.run_id.replace('/', '_')}-{hospital_name(hospital)}.html",
            mime="text/html",
            icon=":material/download:",
            key="slide_report",
            on_click="ignore",
        )
        command = (
            f"gastric-fl report {info.path} --html --floor {floor.sensitivity:.2f} --min-slides {floor.min_slides}"
            f" --review-specificity {floor.specificity:.2f}"
        )
        st.caption(
            "One self-contained file: the verdict against the floor set on the Verdict page "
            f"({floor.words}), metrics at the model's threshold, ROC curve, confusion matrix, example "
            f"tiles, the slides scored here, settings and dataset hash. The same as `{command}`."
        )


_page()
