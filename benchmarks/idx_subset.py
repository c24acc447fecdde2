"""Write the first N images of each IDX image set as a smaller dataset (`pipeline.idx.write_subset`), e.g. a tenth
of Fashion-MNIST for a quick run of the Table 7 presets (docs/pipeline.md, "PFLlib's partition"):

    .venv/bin/python benchmarks/idx_subset.py --input /usr/share/datasets/fashion-mnist --out data/raw/fmnist_7k \
        --take train=6000 --take t10k=1000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.idx import FASHION_MNIST_DIR, write_subset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=FASHION_MNIST_DIR, help="folder of IDX image sets")
    parser.add_argument("--out", type=Path, required=True, help="new folder for the subset")
    parser.add_argument("--take", action="append", default=[], help="SET=N: the first N images of SET (repeatable)")
    args = parser.parse_args(argv)
    try:
        counts = {}
        for item in args.take:
            name, _, value = item.partition("=")
            if not value.isdigit():
                raise PipelineError(f"--take {item!r}: write SET=N, e.g. train=6000")
            counts[name] = int(value)
        written = write_subset(args.input, args.out, counts)
    except (PipelineError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for pair in written:
        print(f"wrote {pair.images} and {pair.labels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
