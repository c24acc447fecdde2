"""Ablation grids and paper-style result tables (FedSAF paper 001, Sec. 4.3-4.4: Tables 4-7, Figures 4-5).

``gastric-fl ablate`` runs a grid of federations and writes the tables; one module per step:

- `federation.ablation.grid`: the settings varied (blocks of setting values), their cells (one run per
  combination and seed) and the plan that runs them (`load_plan`);
- `federation.ablation.running`: every cell as an ordinary run directory under ``<out>/cells/<cell id>/``,
  resumable, with ``<out>/ablation.json`` listing each cell's settings, seed, run directory and status
  (`run_plan`; ``data/README.md``, section 4);
- `federation.ablation.tables`: per block, the mean and sample standard deviation over seeds of each run's
  figures, the accuracy curves, and the paired differences as tables (`write_tables`);
- `federation.ablation.paired`: each method's paired difference to Separate and to FedAvg over the same seeds,
  with a 95% t interval and the minimum detectable difference at 80% power (`paired_rows`, `paired_interval`);
- `federation.ablation.publishing`: a copy of the tables and the small raw files behind them (`publish`);
- `federation.ablation.archive`: a published folder's run records as one deterministic ``cells.tar.xz``
  (`pack_folder`, `cells_folder`).

Every public name of these modules is importable from ``federation.ablation`` itself.
"""

from federation.ablation.archive import CELLS_ARCHIVE, cells_folder, pack_files, pack_folder, unpack
from federation.ablation.grid import (
    ALIASES,
    SHORT,
    TABLE_KINDS,
    Block,
    Cell,
    Plan,
    full_key,
    load_plan,
    parse_grid,
    parse_value,
)
from federation.ablation.paired import (
    PAIRED_FIELDS,
    PAIRED_REFERENCES,
    T_80,
    T_975,
    PairedStats,
    method_label,
    method_variant,
    minimum_detectable_difference,
    paired_differences,
    paired_interval,
    paired_rows,
    paired_text,
    t_quantile_80,
    t_quantile_975,
)
from federation.ablation.publishing import (
    COMMAND_FILE,
    PUBLISHED_RUN_FILES,
    VERSIONS_FILE,
    installed_versions,
    publish,
)
from federation.ablation.running import (
    ABLATION_FILE,
    CELLS_DIR,
    TrainFn,
    cell_status,
    run_plan,
    shown_path,
)
from federation.ablation.tables import (
    METRIC_FIELDS,
    METRIC_LABELS,
    PAIRED_NOTE,
    TABLE_COLUMNS,
    TABLE_NUMBERS,
    TABLE_TITLES,
    csv_rows,
    group_rows,
    markdown_rows,
    paired_context_keys,
    paired_csv,
    paired_markdown,
    plot_curves,
    run_figures,
    write_tables,
)

__all__ = [
    "ABLATION_FILE",
    "ALIASES",
    "CELLS_ARCHIVE",
    "CELLS_DIR",
    "COMMAND_FILE",
    "METRIC_FIELDS",
    "METRIC_LABELS",
    "PAIRED_FIELDS",
    "PAIRED_NOTE",
    "PAIRED_REFERENCES",
    "PUBLISHED_RUN_FILES",
    "SHORT",
    "TABLE_COLUMNS",
    "TABLE_KINDS",
    "TABLE_NUMBERS",
    "TABLE_TITLES",
    "T_80",
    "T_975",
    "VERSIONS_FILE",
    "Block",
    "Cell",
    "PairedStats",
    "Plan",
    "TrainFn",
    "cell_status",
    "cells_folder",
    "csv_rows",
    "full_key",
    "group_rows",
    "installed_versions",
    "load_plan",
    "markdown_rows",
    "method_label",
    "method_variant",
    "minimum_detectable_difference",
    "pack_files",
    "pack_folder",
    "paired_context_keys",
    "paired_csv",
    "paired_differences",
    "paired_interval",
    "paired_markdown",
    "paired_rows",
    "paired_text",
    "parse_grid",
    "parse_value",
    "plot_curves",
    "publish",
    "run_figures",
    "run_plan",
    "shown_path",
    "t_quantile_80",
    "t_quantile_975",
    "unpack",
    "write_tables",
]
