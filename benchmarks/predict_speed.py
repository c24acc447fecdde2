"""Tile-scoring throughput (tiles/s) of ``gastric-fl predict`` against the engine's evaluation loop, side by side.

Both score the same tiles with the same model (MobileNetV3-Small, random weights: the weights do not change the
cost) in eval mode, same batch size, same torch threads:

- **engine evaluation**: ``federation.hospital.trainer.Trainer.evaluate`` over the tiles held in memory as the engine
  holds a
  hospital's test split (``uint8``, already resized to ``input_size``): normalisation, forward pass, loss,
  softmax;
- **predict scoring**: ``inference.score_positions`` from the decoded slide: it cuts each square as prepare does
  (`pipeline.tiling.cut_square`), resizes it (`models.preprocess`), normalises and runs the forward pass;
- **predict, whole slide**: ``inference.predict_slide`` from the decoded slide: tissue detection, scoring, ground
  truth from the mask, the overlay PNG, ``tiles.csv`` and ``summary.json`` written to disk (decoding the slide
  file is left out; ``prepare`` pays it too).

The slides are the synthetic SEED generator's, prepared with one hospital, so the tiles are exactly those predict
cuts (the probabilities of the two scorers are compared and their largest difference reported). The three are
interleaved, and the median of ``--repeats`` passes over all tiles is reported. It prints the figures and writes
them, with the command, to benchmarks/results/predict_speed.md.

    .venv/bin/python benchmarks/predict_speed.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, machine, write_result  # noqa: E402
from federation.hospital.data import HospitalData  # noqa: E402
from federation.hospital.trainer import Trainer  # noqa: E402
from inference import find_slides, plan_of, predict_slide, read_slide, score_positions, tissue_positions  # noqa: E402
from models import base_keys, create_model, split_units  # noqa: E402
from models.bundle import Bundle, ModelCard, TileGrid  # noqa: E402
from models.preprocess import Preprocess  # noqa: E402
from pipeline.config import build_config  # noqa: E402
from pipeline.prepare import prepare_dataset  # noqa: E402
from pipeline.synth import generate_dataset  # noqa: E402
from pipeline.tiling import cut_square  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "predict_speed.md"


def make_bundle(prepared: Path, input_size: int) -> Bundle:
    """A bundle of a random-weight MobileNetV3-Small with the card prepare's record implies for hospital 0."""
    record = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    entry, tiles = record["clients"][0], record["config"]["tiles"]
    card = ModelCard(
        architecture="mobilenet_v3_small",
        num_classes=2,
        class_names=("normal", "abnormal"),
        nhead=0,
        head_units=(),
        preprocess=Preprocess(input_size=input_size, tile_px=entry["tile_px"], scale=entry["scale"]),
        tiling=TileGrid(
            source_px=entry["source_px"],
            stride_px=entry["stride_source_px"],
            abnormal_stride_px=entry["abnormal_stride_source_px"],
            white_level=tiles["white_level"],
            background_max=tiles["background_max"],
            white_max=tiles["white_max"],
            source_format="seed",
        ),
    )
    torch.manual_seed(0)
    model = create_model(card.architecture, 2, 3).eval()
    return Bundle(folder=prepared, card=card, model=model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slides", type=int, default=4)
    parser.add_argument("--size", type=int, default=512, help="slide side in pixels")
    parser.add_argument("--tile", type=int, default=64)
    parser.add_argument("--input-size", type=int, default=64, help="the engine's default data.input_size")
    parser.add_argument("--batch", type=int, default=128, help="the engine's default data.eval_batch_size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the engine's default run.threads)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        raw, prepared = work / "raw", work / "prepared"
        generate_dataset(raw, "seed", images=args.slides, seed=0, size=args.size)
        prepare_dataset(
            build_config(
                None,
                {
                    "source": {"format": "seed", "input": raw},
                    "split": {"clients": 1, "test_fraction": 0.5},
                    "tiles": {"tile": args.tile},
                    "output": {"out": prepared, "progress": False},
                },
            )
        )
        bundle = make_bundle(prepared, args.input_size)
        slides = [read_slide(f) for f in find_slides(raw)]
        positions = [tissue_positions(s.image, bundle.card, s.file.name) for s in slides]
        total = sum(len(p) for p in positions)
        plan = plan_of(bundle.card)
        pre = bundle.card.preprocess
        tiles = np.stack(
            [
                pre.fit(cut_square(s.image, None, x, y, plan))
                for s, ps in zip(slides, positions, strict=True)
                for x, y in ps
            ]
        )
        labels = np.zeros(total, dtype=np.int64)
        data = HospitalData(0, tiles[:2], labels[:2], tiles, labels, [f"t{i}" for i in range(total)], grayscale=False)
        client = Trainer(
            data,
            bundle.model,
            base_keys(split_units(bundle.model), 0),
            batch_size=32,
            eval_batch_size=args.batch,
            augment=False,
        )
        out = work / "predict"
        out.mkdir()

        def engine() -> np.ndarray:
            with torch.inference_mode():
                return np.asarray(client.evaluate().prob_abnormal)

        def scoring() -> np.ndarray:
            return np.concatenate(
                [
                    score_positions(bundle, s.image, p, batch_size=args.batch)
                    for s, p in zip(slides, positions, strict=True)
                ]
            )

        def whole() -> np.ndarray:
            for s in slides:
                predict_slide(bundle, s, out, batch_size=args.batch, progress=False)
            return np.zeros(0)

        runs: dict[str, Callable[[], np.ndarray]] = {
            "engine evaluation (Client.evaluate)": engine,
            "predict scoring (score_positions)": scoring,
            "predict whole slide (predict_slide, files written)": whole,
        }
        difference = float(np.abs(engine() - scoring()).max())
        whole()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)

    medians = {name: statistics.median(t) for name, t in times.items()}
    engine_s = medians["engine evaluation (Client.evaluate)"]
    rows = [
        f"| {name} | {seconds:.3f} | {min(times[name]):.3f} | {total / seconds:.0f} | {engine_s / seconds:.2f} |"
        for name, seconds in medians.items()
    ]
    text = "\n".join(
        [
            "# Predict throughput: predict's tile scoring vs the engine's evaluation loop",
            "",
            f"Command: `{command_line('predict_speed.py')}`",
            "",
            f"{machine()}, torch {torch.__version__}, torch threads: {torch.get_num_threads()} (the engine's default).",
            "",
            f"Workload: {args.slides} synthetic SEED slides of {args.size}x{args.size}, {args.tile} px tiles on "
            f"prepare's grid, {total} tissue tiles in all; MobileNetV3-Small at input "
            f"{args.input_size}x{args.input_size}, batch {args.batch}, CPU, eval mode; the three interleaved, "
            f"{args.repeats} repetitions after a warm-up.",
            "",
            "| scorer | median pass (s) | best pass (s) | tiles/s (median) | speed relative to the engine |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            f"Largest difference between the two scorers' probabilities on the same tiles: {difference:.2e}.",
            "",
            "The engine's loop starts from tiles already decoded and resized at load time (`load_hospitals`), so "
            "its figure is the forward pass plus normalisation; predict also cuts and resizes every square from the "
            "slide on the fly. The whole-slide row adds tissue detection, the ground truth from the mask, the "
            "overlay and the three files per slide.",
            "",
        ]
    )
    print(text)
    write_result(args.out, text)


if __name__ == "__main__":
    main()
