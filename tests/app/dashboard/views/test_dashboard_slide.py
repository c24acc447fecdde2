"""The Slide page through Streamlit's AppTest on a tiny trained run: the heatmap has the slide's size, the opacity
slider drives the heatmap layer, a picked tile shows the probability the run itself gave it (predictions.csv), a
second visit reads the cache, the report download is the hospital's report, and damaged input is one line."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest
from support.dashboard import MAIN, Fixture, open_page
from support.images import bomb_png, bomb_tiff
from support.slides import TrainedRoot, build_trained_root, copy_root

from app import report_html, slide_upload, slide_view

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedRoot:
    return build_trained_root(tmp_path_factory.mktemp("slide") / "data")


@pytest.fixture
def data(trained: TrainedRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TrainedRoot:
    """A fresh data root for each test (its own run folder, so its own slide cache)."""
    fresh = copy_root(trained, tmp_path / "data")
    monkeypatch.setenv("GASTRIC_FL_DATA", str(fresh.root))
    return fresh


def _pick_slide(at: AppTest, source: str) -> AppTest:
    box = at.selectbox(key="slide_pick")
    box.select_index(next(i for i, option in enumerate(box.options) if option.startswith(f"{source} ")))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metric(at: AppTest, label: str) -> str:
    return next(str(m.value) for m in at.metric if m.label == label)


def _layers(at: AppTest) -> dict[str, dict[str, Any]]:
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    return {trace["name"]: trace for trace in spec["data"]}


def _array(value: Any) -> np.ndarray:
    """A Plotly array from the figure's JSON: a list, or a typed array (``{"dtype", "bdata"}``, base64)."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.asarray(value)


def _png_size(uri: str) -> tuple[int, int]:
    assert uri.startswith("data:image/png;base64,")
    image = cv2.imdecode(np.frombuffer(base64.b64decode(uri.split(",", 1)[1]), np.uint8), cv2.IMREAD_UNCHANGED)
    return int(image.shape[1]), int(image.shape[0])


def _one_line_error(at: AppTest, *words: str) -> str:
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.error) == 1, [e.value for e in at.error]
    message = str(at.error[0].value)
    assert "\n" not in message, message
    assert "Traceback" not in message, message
    for word in words:
        assert word in message, message
    return message


def test_the_heatmap_has_the_slides_size_and_the_slider_sets_its_opacity(data: TrainedRoot) -> None:
    source = data.test_slides(0, "abnormal")[0]
    at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    height, width = cv2.imread(str(data.raw / source), cv2.IMREAD_UNCHANGED).shape[:2]
    layers = _layers(at)
    assert {"slide", "heat", "outline", "tiles"} <= set(layers)  # the SEED mask beside it gives the outline
    for name in ("slide", "heat", "outline"):
        assert _png_size(layers[name]["source"]) == (width, height)  # 256 px: drawn at the slide's own size
        assert layers[name]["dx"] == layers[name]["dy"] == 1.0
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["xaxis"]["range"] == [0, width]
    assert spec["layout"]["yaxis"]["range"] == [height, 0]
    assert at.get("plotly_chart")[0].proto.alt.startswith("Heatmap of P(abnormal)")

    slider = at.slider(key="slide_opacity")
    assert slider.label == "Heatmap opacity"
    assert layers["heat"]["opacity"] == slider.value == 0.5
    slider.set_value(0.2)
    at.run()
    layers = _layers(at)
    assert layers["heat"]["opacity"] == 0.2
    assert layers["slide"].get("opacity", 1.0) == 1.0  # only the heatmap fades

    summary = json.loads(next((data.hospital(0) / "slides").rglob("summary.json")).read_text())
    assert _metric(at, "Tiles scored") == str(summary["tiles"])  # predict's grid: the slide's score and call
    assert len(_array(layers["tiles"]["x"])) == len(data.evaluated(0, source))  # drawn: its prepared test tiles
    assert _metric(at, "Max P(abnormal)") == f"{summary['max_probability']:.3f}"
    assert _metric(at, "Abnormal tissue") == f"{100 * summary['abnormal_area_fraction']:.1f} %"
    assert _metric(at, f"Mean of top {summary['top_k']}") == f"{summary['top_k_mean']:.3f}"
    captions = " ".join(str(c.value) for c in at.caption)
    k, tiles = summary["top_k"], summary["tiles"]
    assert f"Mean of top {k}: the mean of the {k} highest tile probabilities, the slide's score." in captions
    assert f"Abnormal tissue: of the area under the slide's {tiles} tissue tiles, the share under tiles" in captions
    assert "as in prepare" not in captions
    # a test slide's tile figures are its prepared test tiles' (the Hospital page's): all abnormal here, so no
    # specificity, whatever the heatmap grid's normal tiles give
    assert _metric(at, "Tile specificity") == "n/a"
    assert summary["ground_truth"]["specificity"] is not None


@pytest.mark.parametrize("client", [0, 1])  # hospital 1 is gray
def test_a_picked_tile_shows_the_probability_the_run_gave_it(data: TrainedRoot, client: int) -> None:
    source = data.test_slides(client, "normal")[0]
    at = _pick_slide(open_page("slide", {"slide_hospital": client}, TIMEOUT_S), source)
    expected = data.evaluated(client, source)
    assert expected
    tiles = _layers(at)["tiles"]
    xs, ys = _array(tiles["x"]), _array(tiles["y"])
    centres = {(round(x - 32), round(y - 32)): i for i, (x, y) in enumerate(zip(xs, ys, strict=True))}
    for (x, y), probability in list(expected.items())[:3]:
        at.selectbox(key="slide_tile").set_value(centres[(x, y)])
        at.run()
        shown = float(_metric(at, "P(abnormal) of this tile"))
        assert shown == pytest.approx(probability, abs=5e-5)  # 4 decimals of predictions.csv's value
        image = at.get("image")[0]
        assert f"x {x}, y {y}" in image.captions[0]
        assert f"{probability:.4f}" in image.captions[0]
        assert image.proto.imgs[0].alt  # alt text for screen readers
        # the chart marks the picked tile
        shapes = json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["shapes"]
        assert {(s["x0"], s["y0"]) for s in shapes} == {(x, y)}


def test_a_second_visit_reads_the_scored_slide_from_disk(data: TrainedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    source = data.test_slides(0, "normal")[0]
    first = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    max_shown = _metric(first, "Max P(abnormal)")
    assert list((data.hospital(0) / "slides").rglob("view.json"))

    def refuse(*args: object) -> None:
        raise AssertionError("the slide was scored again")

    monkeypatch.setattr(slide_view, "score", refuse)
    again = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    assert _metric(again, "Max P(abnormal)") == max_shown
    assert not again.error


def test_showing_a_scored_slide_imports_no_torch(data: TrainedRoot) -> None:
    source = data.test_slides(0, "normal")[0]
    _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)  # scored and kept in the hospital's folder
    script = f"""
import sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file({MAIN!r}, default_timeout={TIMEOUT_S})
at.run()
at.switch_page("views/slide.py")
at.run()
assert not at.exception, [e.value for e in at.exception]
assert any(m.label == "Max P(abnormal)" for m in at.metric)
print("torch" in sys.modules)
"""
    env = {**os.environ, "GASTRIC_FL_DATA": str(data.root)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_an_uploaded_slide_with_its_mask_is_scored_and_outlined(data: TrainedRoot) -> None:
    source = data.test_slides(0, "abnormal")[0]
    stem = Path(source).stem
    at = open_page("slide", timeout=TIMEOUT_S)
    at.radio(key="slide_source").set_value("Upload a slide")
    at.run()
    at.file_uploader(key="slide_upload").upload("biopsy.png", (data.raw / source).read_bytes(), "image/png")
    at.file_uploader(key="slide_annotation").upload(
        "biopsy_mask.png", (data.raw / f"{stem}_mask.png").read_bytes(), "image/png"
    )
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert "outline" in _layers(at)
    (entry,) = (data.hospital(0) / "slides").glob("*/upload-*")
    summary = json.loads(next(entry.rglob("summary.json")).read_text())
    assert summary["slide"] == "biopsy"
    assert _metric(at, "Tiles scored") == str(summary["tiles"])
    assert "ground_truth" in summary


def _serve_spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """The HTML files the page serves for download, by file name, as Streamlit's media storage receives them."""
    served: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def spy(self: MemoryMediaFileStorage, path_or_data: Any, mimetype: str, kind: Any, filename: Any = None) -> str:
        if isinstance(filename, str) and filename.endswith(".html"):
            served[filename] = path_or_data
        return original(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", spy)
    return served


def test_the_report_download_is_the_hospitals_html_report(data: TrainedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    served = _serve_spy(monkeypatch)
    source = data.test_slides(0, "normal")[0]
    at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    button = at.get("download_button")[0]
    assert "report (HTML)" in button.proto.label
    name = f"{data.run.name}-client_00.html"
    assert name in served
    page = served[name].decode("utf-8")
    direct = report_html.report_html(data.run, 0)

    def stable(text: str) -> str:
        return re.sub(r"Written \S+ by", "Written ... by", text)

    assert stable(page) == stable(direct)
    assert f'data-slide="{Path(source).name}"' in page  # the slide scored on the page is in the report, by file name
    assert not list(data.run.rglob("*.html"))  # served from memory: the page writes no report anywhere
    # the same document as the file gastric-fl report --html writes, which goes into the hospital's own folder
    (written,) = report_html.write_html_reports([data.run], hospitals=[0], score_missing=False)
    assert written == data.hospital(0) / "report.html"
    assert stable(written.read_text(encoding="utf-8")) == stable(page)


def test_a_run_without_exported_models_says_what_to_do(fixture_root: Fixture) -> None:
    at = open_page("slide", timeout=TIMEOUT_S)
    assert "exported model" in " ".join(str(i.value) for i in at.info)
    assert not at.error


def test_the_page_explains_the_next_step_with_no_data(empty_root: Path) -> None:
    at = open_page("slide", timeout=TIMEOUT_S)
    assert "gastric-fl" in " ".join(str(e.value) for e in (*at.info, *at.code))


def _damage_card(data: TrainedRoot, change: dict[str, Any] | None) -> None:
    path = data.hospital(0) / "model.json"
    if change is None:
        path.write_text("{ truncated", encoding="utf-8")
    else:
        path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")) | change), encoding="utf-8")


def test_a_damaged_model_card_is_one_line(data: TrainedRoot) -> None:
    _damage_card(data, None)
    _one_line_error(open_page("slide", timeout=TIMEOUT_S), "model.json", "not readable JSON")


def test_a_bundle_that_does_not_fit_is_one_line(data: TrainedRoot) -> None:
    _damage_card(data, {"architecture": "resnet18"})  # MobileNetV3 weights under a ResNet-18 card
    _one_line_error(open_page("slide", timeout=TIMEOUT_S), "model.safetensors", "does not fit")


def test_a_missing_dataset_is_one_line_and_upload_still_works(data: TrainedRoot) -> None:
    _damage_card(data, {"dataset": {"path": str(data.root / "prepared" / "gone")}})
    config = data.run / "config.toml"
    config.write_text(config.read_text().replace(str(data.prepared), str(data.root / "gone")), encoding="utf-8")
    at = open_page("slide", timeout=TIMEOUT_S)
    _one_line_error(at, "not on this machine", "upload a slide")
    at.radio(key="slide_source").set_value("Upload a slide")
    at.run()
    assert not at.error
    assert not at.exception
    assert at.file_uploader(key="slide_upload")


def _upload(at: AppTest, name: str, content: bytes, annotation: tuple[str, bytes] | None = None) -> AppTest:
    at.radio(key="slide_source").set_value("Upload a slide")
    at.run()
    at.file_uploader(key="slide_upload").upload(name, content, "application/octet-stream")
    if annotation is not None:
        at.file_uploader(key="slide_annotation").upload(*annotation, "application/octet-stream")
    at.run()
    return at


def _no_cache_path(message: str, data: TrainedRoot) -> None:
    """A message about an upload names the uploaded file, never the copy the page keeps in the hospital's folder."""
    assert str(data.root) not in message, message
    assert "upload-" not in message, message
    assert "/slide/" not in message, message


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        (
            "notes.png",
            b"this is not an image",
            ("notes.png: not a PNG, JPEG or TIFF image (it holds text); upload a PNG or TIFF slide",),
        ),
        ("glass.png", cv2.imencode(".png", np.full((256, 256, 3), 245, np.uint8))[1].tobytes(), ("no tissue",)),
        ("cut.png", None, ("cut.png: cannot decode image", "upload a PNG or TIFF slide")),
        ("huge scan.png", bomb_png(60000, 60000), ("huge scan.png: 60000x60000", "limit of 67,108,864 pixels")),
        ("huge.tiff", bomb_tiff(60000, 60000), ("huge.tiff: 60000x60000", "start the dashboard with a larger")),
        ("report.pdf", b"%PDF-1.7", ("report.pdf is not a slide", "upload a PNG or TIFF image", "not .pdf files")),
        ("scan", b"\x89PNG", ("scan is not a slide", "not a file without a suffix")),
    ],
)
def test_a_bad_upload_is_one_line_and_leaves_nothing(
    data: TrainedRoot, name: str, content: bytes | None, words: tuple[str, ...]
) -> None:
    if content is None:  # a truncated PNG
        content = (data.raw / data.test_slides(0, "normal")[0]).read_bytes()[:300]
    at = _upload(open_page("slide", timeout=TIMEOUT_S), name, content)
    message = _one_line_error(at, *words)
    _no_cache_path(message, data)
    assert "b'" not in message  # never a Python bytes literal
    assert "remove it from the input" not in message  # the command line's advice, not the page's
    assert not list((data.hospital(0) / "slides").glob("*/upload-*"))


def test_a_too_large_upload_is_refused_in_words_with_the_limit_and_what_to_do(data: TrainedRoot) -> None:
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "big scan.png", bomb_png(24000, 24000))
    message = _one_line_error(at)
    assert message == (
        "big scan.png: 24000x24000 is 576,000,000 pixels, more than the limit of 67,108,864 pixels; downscale it, "
        "or start the dashboard with a larger --max-pixels"
    )
    assert any("at most 67,108,864 pixels" in str(c.value) for c in at.caption)  # the limit is said before, too
    assert not list((data.hospital(0) / "slides").glob("*/upload-*"))


def test_the_dashboards_pixel_limit_is_a_setting(data: TrainedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gastric-fl dashboard --max-pixels N`` passes N in GASTRIC_FL_MAX_PIXELS: a 256 x 256 slide is over 65535."""
    monkeypatch.setenv(slide_view.MAX_PIXELS_ENV, "65535")
    content = (data.raw / data.test_slides(0, "normal")[0]).read_bytes()
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "biopsy.png", content)
    message = _one_line_error(at, "biopsy.png: 256x256 is 65,536 pixels, more than the limit of 65,535 pixels")
    assert message.endswith("start the dashboard with a larger --max-pixels")
    monkeypatch.setenv(slide_view.MAX_PIXELS_ENV, "many")
    at = open_page("slide", timeout=TIMEOUT_S)
    at.radio(key="slide_source").set_value("Upload a slide")
    at.run()
    _one_line_error(at, "GASTRIC_FL_MAX_PIXELS='many' is not a whole number of pixels", "--max-pixels")
    assert not list((data.hospital(0) / "slides").glob("*/upload-*"))


def test_an_annotation_of_the_wrong_type_is_refused_before_anything_is_kept(data: TrainedRoot) -> None:
    content = (data.raw / data.test_slides(0, "normal")[0]).read_bytes()
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "biopsy.png", content, ("outline.jpg", b"\xff\xd8\xff"))
    _one_line_error(at, "outline.jpg is not an annotation the page can read", "SEED mask (PNG) or a BOT SVG")
    assert not list((data.hospital(0) / "slides").glob("*/upload-*"))


def test_a_black_upload_is_scored_with_a_warning_naming_it(data: TrainedRoot) -> None:
    black = cv2.imencode(".png", np.zeros((256, 256, 3), np.uint8))[1].tobytes()
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "night scan.png", black)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    warning, strange = [str(w.value) for w in at.warning]
    assert warning.startswith("night scan.png: the slide is black (every pixel <= 10)"), warning
    # a black scan is nothing like the hospital's tissue (issue 47): every tile unfamiliar, said beside the warning
    assert strange.startswith("Unfamiliar tissue: 100% of the tiles"), strange
    # and its call is never a bare normal or abnormal
    line = _slide_call(at)
    assert ":gray-background[**UNFAMILIAR: unlike this hospital's slides; do not rely on the call**]" in line, line
    _no_cache_path(warning, data)
    assert _metric(at, "Tiles scored") == "16"


def test_a_model_that_is_not_normal_abnormal_is_explained(data: TrainedRoot) -> None:
    _damage_card(data, {"class_names": list("0123456789"), "num_classes": 10, "positive_class": "9"})
    at = open_page("slide", timeout=TIMEOUT_S)
    (line,) = [str(i.value) for i in at.info]
    assert "Hospital 0: Not applicable to this 10-class model: the Slide page's map of P(abnormal)" in line
    assert not at.error
    assert not at.get("plotly_chart")


def test_a_bad_mask_upload_is_named_as_uploaded(data: TrainedRoot) -> None:
    content = (data.raw / data.test_slides(0, "normal")[0]).read_bytes()
    small = cv2.imencode(".png", np.zeros((128, 128), np.uint8))[1].tobytes()
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "biopsy 7.png", content, ("outline of 7.png", small))
    message = _one_line_error(at)
    assert message == (
        "outline of 7.png: mask is 128x128 but its slide biopsy 7.png is 256x256; the mask must have the slide's size"
    )
    assert not list((data.hospital(0) / "slides").glob("*/upload-*"))


def test_page_messages_name_kept_files_as_uploaded(tmp_path: Path) -> None:
    entry = tmp_path / "slides" / "round_0001-abc" / "upload-0123"
    (entry / "slide").mkdir(parents=True)
    for name in ("a_b.png", "a_b_mask.png"):
        (entry / "slide" / name).write_bytes(b"")
    names = slide_upload.kept_names(entry, "a b.png", "a b mask.png")
    assert names == {entry / "slide" / "a_b.png": "a b.png", entry / "slide" / "a_b_mask.png": "a b mask.png"}
    text = f"{entry / 'slide' / 'a_b.png'}: cannot decode image; a_b_mask.png is 3x3; data_a_b.png stays"
    assert slide_view.shown_text(text, names) == "a b.png: cannot decode image; a b mask.png is 3x3; data_a_b.png stays"
    assert slide_upload.kept_names(tmp_path / "slides" / "round_0001-abc" / "test-s01.png") == {}


def test_the_saved_threshold_makes_the_slide_call_and_colours_the_heatmap(data: TrainedRoot) -> None:
    """Issue 23, items 4 and 6: the threshold saved into the bundle is the one the Slide page calls the slide at, and
    says so; the heatmap layer is transparent where the probability is below it, and the colour bar marks it."""
    from app.held_out import recall, score_held_out
    from models.bundle import set_threshold

    score_held_out(data.hospital(0))  # slides.csv, which the summary line counts
    set_threshold(data.hospital(0), 0.49, "set by hand")
    recall(data.hospital(0), 0.49)
    source = data.test_slides(0, "abnormal")[0]
    at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    summary = json.loads(next((data.hospital(0) / "slides").rglob("summary.json")).read_text())
    assert summary["threshold"] == 0.49
    text = " ".join(str(m.value) for m in at.markdown)
    assert (
        f"Slide call: :{'red' if summary['call'] == 'abnormal' else 'blue'}-background[**{summary['call']}**]" in text
    )
    assert "at threshold 0.49 (set by hand)" in text
    captions = " ".join(str(c.value) for c in at.caption)
    assert re.search(
        r"Hospital 0's \d+ test slides at threshold 0\.49 \(set by hand\): \d+ of \d+ abnormal slides", captions
    )
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    bar = next(t for t in spec["data"] if t.get("name") == "tiles")["marker"]
    assert "▲0.49" in bar["colorbar"]["ticktext"]
    assert bar["colorscale"][1] == [0.49, "rgb(225,225,225)"]  # grey up to the threshold
    # a test slide's heatmap is drawn from its prepared test tiles (the figure's tiles): opaque exactly where the
    # mean P of the tiles covering a pixel reaches the saved threshold; the normal test slide's tiles lie either side
    from pipeline.tile_maps import probability_map

    normal = data.test_slides(0, "normal")[0]
    at = _pick_slide(at, normal)
    entry = "test-" + slide_view.safe_name(normal)
    heat = next(
        p for p in (data.hospital(0) / "slides").rglob(slide_view.PREPARED_HEAT) if p.parent.parent.name == entry
    )
    rgba = cv2.imread(str(heat), cv2.IMREAD_UNCHANGED)
    tiles = _layers(at)["tiles"]
    probabilities = _array(tiles["marker"]["color"])
    size = int(summary["tile_size_px"])
    xs, ys = (_array(tiles["x"]) - size / 2).astype(np.int64), (_array(tiles["y"]) - size / 2).astype(np.int64)
    assert rgba.shape[:2] == (summary["height"], summary["width"])  # drawn at the slide's size: no scaling
    below = probabilities < 0.49
    assert below.any()
    assert (~below).any()
    mean, covered = probability_map(xs, ys, size, probabilities, rgba.shape[:2], 1.0)
    assert (rgba[..., 3] == np.where(covered & (mean >= 0.49), 255, 0)).all()
    assert (rgba[..., 3] == 255).sum() > 0


def test_the_downloaded_report_judges_with_the_floor_on_screen(
    data: TrainedRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.evaluation.verdict import Floor

    served = _serve_spy(monkeypatch)
    # the floor as set on the Verdict page (its shared session values): 0.70, 3 slides, review below 0.40
    state: dict[str, object] = {"floor_sensitivity": 0.7, "floor_min_slides": 3, "floor_specificity": 0.4}
    at = _pick_slide(open_page("slide", state, timeout=TIMEOUT_S), data.test_slides(0, "normal")[0])
    page = served[f"{data.run.name}-client_00.html"].decode("utf-8")
    assert 'data-metric="floor" data-sensitivity="0.70" data-min-slides="3" data-specificity="0.40"' in page
    assert "sensitivity at least 0.70 at the hospital's threshold, at least 3 test slides" in page
    screen = report_html.report_html(data.run, 0, Floor(0.7, 3, 0.4))
    assert re.sub(r"Written \S+ by", "", page) == re.sub(r"Written \S+ by", "", screen)
    captions = " ".join(str(c.value) for c in at.caption)
    assert "--floor 0.70 --min-slides 3 --review-specificity 0.40" in captions


def _slide_call(at: AppTest) -> str:
    (line,) = [str(m.value) for m in at.markdown if "Slide call:" in str(m.value)]
    return line


def _rescore_at(data: TrainedRoot, source: str, threshold: float) -> AppTest:
    """The slide picked again after the card's threshold was saved as ``threshold`` (a new bundle version, so the
    slide is scored anew at it)."""
    from models.bundle import set_threshold

    set_threshold(data.hospital(0), threshold, "set by hand")
    at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    assert f"at threshold {threshold:.2f}" in _slide_call(at)
    return at


def test_a_missed_abnormal_slide_is_marked_as_a_miss_never_a_tick(data: TrainedRoot) -> None:
    """Issue 31: an annotated abnormal slide the model calls normal reads MISSED CANCER with an error icon; called
    abnormal, it gets the tick."""
    source = data.test_slides(0, "abnormal")[0]
    first = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    score = _score(data, first, source)
    assert 0.02 < score < 1.0
    at = _rescore_at(data, source, (score + 1.0) / 2)
    line = _slide_call(at)
    # called normal... (with a tile above the threshold, as a focus to review: issue 47, part 4)
    assert ":orange-background[**normal, with a focus above the threshold: review**]" in line
    assert line.startswith(":material/error: Slide call:"), line
    assert "**MISSED CANCER: the annotation marks abnormal tissue, the model calls it normal**" in line
    shown = " ".join(str(m.value) for m in at.markdown)
    assert ":material/check_circle:" not in shown  # ...so nowhere a tick
    assert "agrees" not in shown
    at = _rescore_at(data, source, score / 2)
    line = _slide_call(at)
    assert line.startswith(":material/check_circle: Slide call: :red-background[**abnormal**]"), line
    assert "agrees with the annotation (abnormal)" in line


def test_a_normal_slide_called_abnormal_is_a_false_alarm(data: TrainedRoot) -> None:
    source = data.test_slides(0, "normal")[0]
    first = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    score = _score(data, first, source)
    assert score > 0.02
    at = _rescore_at(data, source, score / 2)
    line = _slide_call(at)
    assert ":red-background[**abnormal**]" in line
    assert line.startswith(":material/warning: Slide call:"), line
    assert "**FALSE ALARM: the annotation marks no abnormal tissue, the model calls it abnormal**" in line
    assert ":material/check_circle:" not in " ".join(str(m.value) for m in at.markdown)


def _score(data: TrainedRoot, at: AppTest, source: str) -> float:
    """The score of the slide on screen (the mean of its k highest tile probabilities), as shown and exactly."""
    scored = slide_view.load(
        next(e for e in slide_view.scored_entries(data.hospital(0)) if e.name.endswith(slide_view.safe_name(source)))
    )
    assert scored is not None
    summary = scored.summary
    assert _metric(at, f"Mean of top {summary['top_k']}") == f"{summary['top_k_mean']:.3f}"
    return float(summary["top_k_mean"])


def test_the_call_mark_follows_the_annotation() -> None:
    assert slide_view.call_mark("normal", "abnormal")[0] == ":material/error:"
    assert slide_view.call_mark("abnormal", "normal")[0] == ":material/warning:"
    assert slide_view.call_mark("abnormal", "abnormal")[0] == ":material/check_circle:"
    assert slide_view.call_mark("normal", "normal")[0] == ":material/check_circle:"
    for annotated in (None, "", "unknown"):
        assert slide_view.call_mark("normal", annotated) == (":material/info:", "no annotation to check it against")


def test_each_upload_is_shown_under_its_own_name(data: TrainedRoot) -> None:
    """Issue 31: ``case 7.png`` and ``case_7.png`` (the same bytes) are two uploads, each captioned by its own
    name, kept apart, and named so in the hospital's report."""
    content = (data.raw / data.test_slides(0, "normal")[0]).read_bytes()
    for name in ("case 7.png", "case_7.png"):
        at = _upload(open_page("slide", timeout=TIMEOUT_S), name, content)
        assert not at.exception, [e.value for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        captions = [str(c.value) for c in at.caption]
        assert any(c.startswith(f"{name}, 256 x 256 px.") for c in captions), captions
        assert at.get("plotly_chart")[0].proto.alt.startswith(f"Heatmap of P(abnormal) over {name} (256 x 256 px)")
    entries = sorted((data.hospital(0) / "slides").glob("*/upload-*"))
    assert len(entries) == 2  # one entry each: neither overwrites the other
    assert {slide_view.uploaded_names(e)[0] for e in entries} == {"case 7.png", "case_7.png"}
    assert {slide_view.slide_name(s) for s in map(slide_view.load, entries) if s is not None} == {
        "case 7.png",
        "case_7.png",
    }
    page = report_html.report_html(data.run, 0)
    assert 'data-slide="case 7.png" data-kind="upload"' in page
    assert 'data-slide="case_7.png" data-kind="upload"' in page


def test_an_annotation_that_is_not_an_image_says_what_to_upload_instead(data: TrainedRoot) -> None:
    content = (data.raw / data.test_slides(0, "normal")[0]).read_bytes()
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "biopsy 3.png", content, ("outline 3.png", b"a note, no mask"))
    message = _one_line_error(at)
    assert message == (
        "outline 3.png: not a PNG, JPEG or TIFF image (it holds text); upload its annotation as a SEED mask (PNG) or "
        "a BOT SVG instead, or no annotation"
    )
    _no_cache_path(message, data)
    assert not list((data.hospital(0) / "slides").glob("*/upload-*"))


def _caption_with(at: AppTest, words: str) -> str:
    (line,) = [str(c.value) for c in at.caption if words in str(c.value)]
    return line


def test_the_slide_pages_counts_are_the_other_pages_counts(data: TrainedRoot) -> None:
    """Issue 47: the summary line counts the slides as slides.csv does (the Verdict and Hospital pages' count), not
    from the prepared test tiles; the tile figures of a test slide are its prepared test tiles, the ones the other
    pages count. Constructed: slides.csv calls the abnormal slide abnormal, then normal, whatever its tiles say
    (one of the two contradicts the tiles' own top-k mean)."""
    from app.evaluation.metrics import operating_point
    from app.evaluation.verdict import Floor
    from app.run_predictions import read_prediction_file
    from app.verdicts import judge_run
    from models.decision import slide_stem

    folder = data.hospital(0)
    (abnormal,), normal = data.test_slides(0, "abnormal"), data.test_slides(0, "normal")
    for score, found in ((0.9, 1), (0.01, 0)):
        call = "abnormal" if found else "normal"
        rows = [f"{abnormal},abnormal,{score},{call},0.5,4"] + [f"{s},normal,0.01,normal,0.5,4" for s in normal]
        (folder / "slides.csv").write_text("slide,truth,score,call,threshold,tiles\n" + "\n".join(rows) + "\n")
        (judged,) = [j for j in judge_run(data.run, Floor(), None).judgements if j.hospital == 0]
        slide_point = judged.score.slide_point
        assert slide_point is not None
        assert (slide_point.tp, slide_point.abnormal) == (found, 1)  # what the Verdict and Hospital pages say
        at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), abnormal)
        line = _caption_with(at, "abnormal slides called abnormal")
        assert f"{found} of 1 abnormal slides called abnormal, {len(normal)} of {len(normal)} normal" in line
        assert "(slides.csv)" in line
    # the tile figures: this slide's prepared test tiles at the card's threshold, as the Hospital page counts them
    tiles = read_prediction_file(folder / "predictions.csv")
    mine = tiles[[slide_stem(str(p)) == Path(abnormal).stem for p in tiles["path"]]]
    assert len(mine)
    point = operating_point(mine["label"].to_numpy(), mine["prob_abnormal"].to_numpy(), 0.5)
    assert _metric(at, "Tile sensitivity") == f"{point.sensitivity:.3f}"
    assert f"({point.tp} of {point.abnormal} abnormal called abnormal" in _caption_with(at, "prepared test tiles (")
    # without slides.csv the page says so instead of counting another way
    (folder / "slides.csv").unlink()
    at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), abnormal)
    assert not [c for c in at.caption if "abnormal slides called abnormal" in str(c.value)]
    assert _caption_with(at, "test slides are not counted here").endswith(
        "the hospital's test slides are scored when a run ends (gastric-fl train)."
    )


def test_the_heatmap_colours_exactly_the_tiles_the_page_counts(data: TrainedRoot) -> None:
    """Issue 47, item 3: a held-out test slide is drawn from its prepared test tiles (manifest.csv's corners,
    predictions.csv's probabilities), so the tiles coloured at or above the threshold in the figure's data are the
    tiles the page counts as called abnormal, and those the Hospital page counts; an upload keeps predict's grid,
    and each caption says which grid it shows."""
    from app.run_predictions import read_prediction_file
    from models.decision import slide_stem

    folder = data.hospital(0)
    source = data.test_slides(0, "normal")[0]  # its prepared test tiles lie either side of the threshold 0.5
    at = _pick_slide(open_page("slide", timeout=TIMEOUT_S), source)
    tiles = _layers(at)["tiles"]
    probabilities = _array(tiles["marker"]["color"])
    coloured = int((probabilities >= 0.5).sum())
    rows = read_prediction_file(folder / "predictions.csv")
    mine = rows[[slide_stem(str(p)) == Path(source).stem for p in rows["path"]]]
    assert len(probabilities) == len(mine)
    assert sorted(probabilities.tolist()) == sorted(mine["prob_abnormal"].tolist())
    counted = int((mine["prob_abnormal"] >= 0.5).sum())  # the Hospital page's tiles called abnormal
    assert 0 < coloured == counted < len(mine)  # some tiles each side: a count that could differ
    line = _caption_with(at, "prepared test tiles (")
    assert f"{coloured} tiles called abnormal)" in line
    grid = _caption_with(at, "Drawn from")
    assert grid.startswith(f"Drawn from this test slide's {len(mine)} prepared test tiles, placed by manifest.csv")
    summary = json.loads(next((folder / "slides").rglob("summary.json")).read_text())
    assert f"on its grid of {summary['tiles']} tiles over the whole slide (slides.csv)" in grid
    # an upload of the same slide: predict's grid, said so
    pixels = (data.raw / source).read_bytes()
    at = _upload(open_page("slide", timeout=TIMEOUT_S), "mine.png", pixels)
    assert len(_array(_layers(at)["tiles"]["x"])) == summary["tiles"]
    assert _caption_with(at, "Drawn from").startswith(f"Drawn from predict's grid of {summary['tiles']} tiles")
