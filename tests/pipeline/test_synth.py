"""Tests for `gastric-fl synth`: the SEED and BOT layouts, SVG annotations, determinism, difficulty, bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import svgelements as se
import tifffile
from PIL import Image
from support.checks import every
from typer.testing import CliRunner

from app.cli import app
from pipeline import synth
from pipeline.errors import PipelineError
from pipeline.synth import generate_dataset, plan_dataset, render_slide
from pipeline.synth_shapes import make_regions, rasterize, svg_document

ROOT = Path(__file__).resolve().parents[2]
SEED_SIZE = 160
BOT_SIZE = 192


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _svg_mask(path: Path, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Rasterise an annotation with svgelements: fill every closed subpath of every shape. Returns mask, points."""
    svg = se.SVG.parse(str(path))
    mask = np.zeros((size, size), np.uint8)
    every = []
    for element in svg.elements():
        if not isinstance(element, se.Shape):
            continue
        path_obj = abs(se.Path(element))  # abs() applies the element's (and its groups') transform
        for sub in path_obj.as_subpaths():
            pts = np.array(se.Path(sub).npoint(np.linspace(0.0, 1.0, 800)), dtype=np.float64)
            every.append(pts)
            cv2.fillPoly(mask, [np.round(pts * 16).astype(np.int32)], 1, lineType=cv2.LINE_8, shift=4)
    return mask, np.concatenate(every) if every else np.zeros((0, 2))


@pytest.fixture(scope="module")
def seed_data(tmp_path_factory: pytest.TempPathFactory) -> synth.SynthSummary:
    out = tmp_path_factory.mktemp("seed") / "ds"
    return generate_dataset(out, "seed", images=6, seed=11, size=SEED_SIZE)


@pytest.fixture(scope="module")
def bot_data(tmp_path_factory: pytest.TempPathFactory) -> synth.SynthSummary:
    out = tmp_path_factory.mktemp("bot") / "ds"
    return generate_dataset(out, "bot", images=4, seed=5, size=BOT_SIZE, difficulty=0.2, abnormal_fraction=0.75)


def test_seed_layout_masks_match_images(seed_data: synth.SynthSummary) -> None:
    out = seed_data.out
    info = json.loads((out / "synth.json").read_text())
    names = {p.name for p in out.iterdir()}
    expected = {f"{s['id']}.png" for s in info["slides"]} | {f"{s['id']}_mask.png" for s in info["slides"]}
    assert names == expected | {"synth.json"}
    assert seed_data.n_normal == seed_data.n_abnormal == 3  # SEED default: balanced
    assert len(info["slides"]) == 6
    for slide in info["slides"]:
        image = Image.open(out / f"{slide['id']}.png")
        mask = Image.open(out / f"{slide['id']}_mask.png")
        assert image.mode == "RGB"
        assert mask.mode == "L"  # single-channel 8-bit
        assert image.size == mask.size == (SEED_SIZE, SEED_SIZE)
        values = np.asarray(mask)
        assert set(np.unique(values)) <= {0, 255}
        if slide["label"] == "normal":
            assert not values.any()
        else:
            assert values.any()


def test_classic_carcinoma_is_painted_inside_the_mask() -> None:
    """The classic tissue's carcinoma is darker (crowded hyperchromatic nuclei) inside its mask than outside it
    (the gastric mixture is tested in test_synth_patterns.py: there darkness does not mark the carcinoma)."""
    abnormal = [p for p in plan_dataset("seed", 6, seed=11) if p.abnormal]
    assert len(abnormal) == 3
    for plan in abnormal:
        slide = render_slide(plan, "seed", SEED_SIZE, 0.0, "classic")
        gray = np.asarray(Image.fromarray(slide.image).convert("L"), dtype=np.float64)
        inside = slide.mask > 0
        tissue = gray < 230  # compare tissue with tissue: background and empty lumina are left out
        assert gray[inside & tissue].mean() < gray[~inside & tissue].mean() - 15


def test_bot_layout(bot_data: synth.SynthSummary) -> None:
    out = bot_data.out
    assert (bot_data.n_normal, bot_data.n_abnormal) == (1, 3)
    normal = sorted((out / "normal").iterdir())
    abnormal = sorted((out / "abnormal").iterdir())
    assert [p.suffix for p in normal] == [".tiff"]
    tiffs = [p for p in abnormal if p.suffix == ".tiff"]
    svgs = [p for p in abnormal if p.suffix == ".svg"]
    assert len(tiffs) == 3
    assert [p.stem for p in svgs] == [p.stem for p in tiffs]
    for path in [*normal, *tiffs]:
        image = tifffile.imread(path)
        assert image.shape == (BOT_SIZE, BOT_SIZE, 3)
        assert image.dtype == np.uint8


def test_bot_svg_parses_and_encloses_the_rendered_carcinoma(bot_data: synth.SynthSummary) -> None:
    plans = {p.slide_id: p for p in plan_dataset("bot", 4, seed=5, abnormal_fraction=0.75)}
    annotations = sorted((bot_data.out / "abnormal").glob("*.svg"))
    assert len(annotations) == 3
    for svg_path in annotations:
        text = svg_path.read_text()
        svg = se.SVG.parse(str(svg_path))
        assert (svg.width, svg.height) == (BOT_SIZE, BOT_SIZE)
        assert (svg.viewbox.x, svg.viewbox.y, svg.viewbox.width, svg.viewbox.height) == (0, 0, BOT_SIZE, BOT_SIZE)
        assert "<g " in text
        assert 'transform="translate(' in text
        mask, points = _svg_mask(svg_path, BOT_SIZE)
        assert mask.any()
        assert points.min() >= 0  # every shape inside the image
        assert points.max() <= BOT_SIZE
        truth = render_slide(plans[svg_path.stem], "bot", BOT_SIZE, 0.2).mask > 0
        iou = np.logical_and(truth, mask).sum() / np.logical_or(truth, mask).sum()
        assert iou > 0.97


def test_annotations_use_curves_polygons_groups_and_outlines() -> None:
    """Across slides, the generator writes every SVG feature a drawing tool would, all rasterising consistently."""
    seen: set[str] = set()
    for seed in range(12):
        regions = make_regions(np.random.default_rng(seed), 300, 0.3, 3)
        text = svg_document(regions, 300, "t")
        for feature, marker in (
            ("cubic", " C "),
            ("quadratic", " Q "),
            ("relative", " q "),
            ("polygon", "<polygon"),
            ("outline", 'fill="none"'),
            ("filled", "fill:#ff0000"),
            ("rotate", "rotate("),
        ):
            if marker in text:
                seen.add(feature)
        assert rasterize(regions, 300).any()
    assert seen == {"cubic", "quadratic", "relative", "polygon", "outline", "filled", "rotate"}


def test_same_seed_same_bytes_different_seed_different(tmp_path: Path) -> None:
    a = generate_dataset(tmp_path / "a", "seed", images=3, seed=7, size=128, difficulty=0.4)
    b = generate_dataset(tmp_path / "b", "seed", images=3, seed=7, size=128, difficulty=0.4)
    c = generate_dataset(tmp_path / "c", "seed", images=3, seed=8, size=128, difficulty=0.4)
    assert _digest(a.out) == _digest(b.out)
    da, dc = _digest(a.out), _digest(c.out)
    images = [name for name in da if name.endswith(".png") and not name.endswith("_mask.png")]
    assert len(images) == 3
    assert every(da[name] != dc[name] for name in images)
    t1 = generate_dataset(tmp_path / "t1", "bot", images=2, seed=1, size=128, abnormal_fraction=0.5)
    t2 = generate_dataset(tmp_path / "t2", "bot", images=2, seed=1, size=128, abnormal_fraction=0.5)
    assert _digest(t1.out) == _digest(t2.out)


def test_workers_write_the_same_bytes_as_one_process(tmp_path: Path) -> None:
    """Slides painted in 3 processes (chunks of 1, out of order) are the files one process writes, in one order."""
    one = generate_dataset(tmp_path / "one", "seed", images=7, seed=5, size=128, difficulty=0.3)
    three = generate_dataset(tmp_path / "three", "seed", images=7, seed=5, size=128, difficulty=0.3, workers=3)
    assert len(_digest(one.out)) == 15  # 7 slides + 7 masks + the marker
    assert _digest(one.out) == _digest(three.out)
    bot_one = generate_dataset(tmp_path / "b1", "bot", images=3, seed=2, size=128, abnormal_fraction=0.5)
    bot_two = generate_dataset(tmp_path / "b2", "bot", images=3, seed=2, size=128, abnormal_fraction=0.5, workers=2)
    assert _digest(bot_one.out) == _digest(bot_two.out)


def test_default_class_balance() -> None:
    bot = plan_dataset("bot", 10, seed=0)
    seed = plan_dataset("seed", 10, seed=0)
    assert sum(p.abnormal for p in bot) == 8  # BOT: 560 abnormal of 700
    assert sum(p.abnormal for p in seed) == 5
    few = plan_dataset("seed", 4, seed=0, abnormal_fraction=0.05)
    assert sum(p.abnormal for p in few) == 1  # both classes whenever the fraction asks for both


def _contrast(difficulty: float) -> tuple[float, float]:
    """(darkness of carcinoma minus darkness of normal tissue, mean carcinoma area) over a few small slides."""
    plans = plan_dataset("seed", 8, seed=3, abnormal_fraction=0.5)
    cancer, normal, area = [], [], []
    for plan in plans:
        slide = render_slide(plan, "seed", 128, difficulty, "classic")
        darkness = 255.0 - slide.image.astype(np.float64).mean(axis=2)
        tissue = darkness > 25  # leaves out white background, tears and empty lumina
        if plan.abnormal:
            cancer.append(darkness[tissue & (slide.mask > 0)].mean())
            area.append(slide.cancer_fraction)
        else:
            normal.append(darkness[tissue].mean())
    return float(np.mean(cancer) - np.mean(normal)), float(np.mean(area))


def test_difficulty_narrows_the_class_difference_in_the_classic_tissue() -> None:
    easy_gap, easy_area = _contrast(0.0)
    hard_gap, hard_area = _contrast(1.0)
    assert easy_gap > 15
    assert abs(hard_gap) < 0.4 * easy_gap
    assert hard_area < 0.5 * easy_area


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"images": 0}, "--images"),
        ({"images": -3}, "--images"),
        ({"images": 10**6}, "--images"),
        ({"fmt": "tiff"}, "unknown format 'tiff'"),
        ({"difficulty": 1.5}, "--difficulty"),
        ({"difficulty": float("nan")}, "--difficulty"),
        ({"abnormal_fraction": -0.1}, "--abnormal-fraction"),
        ({"size": 64}, "--size"),
        ({"workers": 0}, "--workers 0"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"out": tmp_path / "ds", "fmt": "seed", "images": 2, "size": 128}
    args.update(kwargs)
    with pytest.raises(PipelineError, match=needle.replace("(", r"\(")):
        generate_dataset(**args)  # type: ignore[arg-type]
    assert not (tmp_path / "ds").exists()


def test_unwritable_output(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(PipelineError, match="a_file"):
        generate_dataset(blocker / "ds", "seed", images=1, size=128)


def test_foreign_and_previous_output(tmp_path: Path) -> None:
    foreign = tmp_path / "hospital"
    foreign.mkdir()
    (foreign / "slide.png").write_bytes(b"real data")
    for overwrite in (False, True):
        with pytest.raises(PipelineError, match="new or empty directory"):
            generate_dataset(foreign, "seed", images=1, size=128, overwrite=overwrite)
    assert (foreign / "slide.png").read_bytes() == b"real data"

    out = tmp_path / "ds"
    generate_dataset(out, "seed", images=2, seed=1, size=128)
    with pytest.raises(PipelineError, match="--overwrite"):
        generate_dataset(out, "seed", images=2, seed=2, size=128)
    summary = generate_dataset(out, "seed", images=1, seed=2, size=128, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([*(f.name for f in summary.files), "synth.json"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_relative_output_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    summary = generate_dataset(Path("rel"), "seed", images=1, size=128)
    assert summary.out == tmp_path.resolve() / "rel"
    assert len(summary.files) == 2  # the slide and its mask
    assert every(f.is_absolute() and f.is_file() for f in summary.files)


def test_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = synth.render_slide

    def flaky(*args: object, **kwargs: object) -> synth.SynthSlide:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(synth, "render_slide", flaky)
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(tmp_path / "ds", "seed", images=3, size=128)
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_dataset(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(
        app, ["synth", "--format", "bot", "--images", "2", "--size", "128", "--out", str(out), "--seed", "4"]
    )
    assert result.exit_code == 0, result.output
    assert str(out.resolve()) in result.output
    assert "2 synthetic BOT slides" in result.output
    assert len(list((out / "abnormal").glob("*.svg"))) + len(list((out / "normal").glob("*.tiff"))) == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--images", "-2"], "--images"),
        (["--format", "png"], "unknown format"),
        (["--tissue", "pale"], "unknown tissue 'pale'"),
        (["--mix", "follicle=-1"], "--mix follicle=-1.0"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "synth", "--out", str(tmp_path / "x"), "--size", "128", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert needle in lines[0]
