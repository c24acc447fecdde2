"""The floor's threshold with and without its margin on a finished run (issue 47, item 2), read only.

For each hospital of ``RUN`` and each floor, the threshold chosen on the validation split by the point estimate
alone (`app.evaluation.threshold.threshold_for_sensitivity`) and by the lower end of the 95% interval on the slides'
effective number of tiles (`app.evaluation.threshold.bounded_threshold`), each with what it gives on the test split:
tile sensitivity, abnormal test slides missed (``slides.csv``) and false alarms. Nothing in the run is written.

    .venv/bin/python benchmarks/threshold_margin.py data/runs/quickstart --floors 0.7 0.8 0.9
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app import operating
from app.evaluation.threshold import TargetThreshold, Unreachable, bounded_threshold, threshold_for_sensitivity
from app.run_predictions import read_prediction_file
from federation.runfiles import PREDICTIONS_FILE, VAL_PREDICTIONS_FILE
from models.decision import slides_of_tiles


def _test(folder: Path, threshold: float) -> str:
    found = operating.consequences_at(folder, threshold)
    if found is None:
        return "no test predictions"
    point = found.point
    slides = (
        ""
        if found.abnormal_slides is None
        else f", missed slides {len(found.missed)}/{found.abnormal_slides}, false alarms "
        f"{len(found.alarms)}/{found.normal_slides}"
    )
    return f"sens {point.sensitivity:.2f}{slides}"


def rows(run: Path, floors: list[float]) -> list[str]:
    """One markdown row per hospital and floor."""
    out = []
    for folder in sorted((run / "hospitals").glob("client_*")):
        val_path = folder / VAL_PREDICTIONS_FILE
        if not val_path.is_file() or not (folder / PREDICTIONS_FILE).is_file():
            continue
        val = read_prediction_file(val_path)
        labels, probs = val["label"].to_numpy(), val["prob_abnormal"].to_numpy()
        keys = slides_of_tiles(val["path"].to_numpy())
        slides = None if keys is None else len({k for k, y in zip(keys, labels, strict=True) if y == 1})
        for floor in floors:
            naive = threshold_for_sensitivity(labels, probs, floor)
            bounded = bounded_threshold(labels, probs, floor, keys)
            naive_cell = "-" if naive is None else f"{naive.threshold:.3f}: {_test(folder, naive.threshold)}"
            if isinstance(bounded, TargetThreshold):
                margin_cell = f"{bounded.threshold:.3f} (bound {bounded.bound:.2f}): {_test(folder, bounded.threshold)}"
            elif isinstance(bounded, Unreachable):
                margin_cell = (
                    f"none proposed (best bound {bounded.best:.2f})"
                    if bounded.at is None or bounded.specificity is None
                    else f"none proposed (bound {bounded.best:.2f} only at {bounded.at:.3f}, validation specificity "
                    f"{bounded.specificity:.2f})"
                )
            else:
                margin_cell = "-"
            counts = f"{int((labels == 1).sum())} / {slides}"
            out.append(f"| {folder.name} | {counts} | {floor:.2f} | {naive_cell} | {margin_cell} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--floors", type=float, nargs="+", default=[0.7, 0.8, 0.9])
    args = parser.parse_args()
    print(
        "| hospital | validation abnormal tiles / slides | floor | point estimate: threshold, on test | "
        "with the margin: threshold, on test |"
    )
    print("|---|---|---|---|---|")
    for row in rows(args.run, args.floors):
        print(row)


if __name__ == "__main__":
    main()
