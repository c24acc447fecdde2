"""Publishing an ablation (e.g. to ``results/NAME``): its tables and the small raw files behind them.

Per finished run its configuration and per-round records (`PUBLISHED_RUN_FILES`, no weights) in one deterministic
archive, ``cells.tar.xz`` (`federation.ablation.archive`), the package versions (`installed_versions`) and the
command that made it, so that the tables can be checked and rebuilt from the copy alone
(``gastric-fl ablate --config PRESET --out DEST --tables-only`` reads the archive).
"""

from __future__ import annotations

from pathlib import Path

from federation.ablation.archive import CELLS_ARCHIVE, pack_files
from federation.ablation.grid import Plan
from federation.ablation.running import ABLATION_FILE, CELLS_DIR, cell_status, shown_path
from federation.errors import FederationError
from federation.provenance import NOT_RECORDED, code_version, describe_code_versions, describe_machines
from federation.runfiles import AGGREGATION_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from federation.runs import read_json, write_json
from federation.summary_errors import read_summary_object
from infra.outputs import (
    OutputError,
    check_replaceable,
    claim_output,
    os_error_message,
    recover_folder,
    replace_folder,
    write_marker,
)

# What recomputes every table of an ablation: per run, its configuration and per-round records (no weights).
PUBLISHED_RUN_FILES = (CONFIG_FILE, SUMMARY_FILE, METRICS_FILE, AGGREGATION_FILE)
VERSIONS_FILE = "versions.txt"
COMMAND_FILE = "COMMAND.md"


def installed_versions(code: str) -> str:
    """Python, the platform, the code (``code_version()``) and every installed distribution as ``name==version``,
    one per line, sorted."""
    import platform
    import sys
    from importlib import metadata

    names = {f"{dist.metadata['Name']}=={dist.version}" for dist in metadata.distributions() if dist.metadata["Name"]}
    head = [f"python {sys.version.split()[0]}", f"platform {platform.platform()}", f"code {code}"]
    return "\n".join([*head, *sorted(names, key=str.lower)]) + "\n"


def publish(plan: Plan, out: Path, dest: Path, command: str, rebuild: str | None = None) -> list[Path]:
    """Copy an ablation's tables and the small raw files behind them to ``dest`` (e.g. ``results/NAME``).

    Per finished run: ``PUBLISHED_RUN_FILES`` (no checkpoints, weights or predictions), packed into
    ``cells.tar.xz`` as ``cells/<run>/<file>`` (`federation.ablation.archive.pack_files`); per ablation:
    ``ablation.json``, ``base_config.toml`` and every table, figure and ``paired`` file ``write_tables`` wrote; plus
    ``versions.txt`` (``installed_versions``) and ``COMMAND.md`` (the command, and how to rebuild the tables
    from the copy alone: ``gastric-fl ablate --config PRESET --out DEST --tables-only``). ``dest`` is claimed like
    any output folder (``infra.outputs.claim_output``), so only a folder this command wrote is replaced, and it is
    written in a hidden sibling and swapped into place (``infra.outputs.replace_folder``), so a failure leaves the
    previous copy as it was. Returns the files written.
    """
    if not (out / "base_config.toml").is_file():
        raise FederationError(f"{out} holds no ablation (no base_config.toml): run gastric-fl ablate first")
    command_name = "ablate --publish"
    try:
        with claim_output(dest, command_name, flag="--publish"):
            recover_folder(dest, command_name)  # our own leftovers from a killed publish (the lock is ours)
            check_replaceable(dest, command_name, flag="--publish")
            with replace_folder(dest) as staging:
                write_marker(staging, command_name, complete=False, record_contents=False)  # ours if killed
                written = _copy_published(plan, out, staging, dest, command, rebuild)
                write_marker(staging, command_name)
    except OutputError as exc:
        raise FederationError(str(exc)) from None
    except OSError as exc:
        raise FederationError(os_error_message(exc, dest, "--publish")) from None
    return written


def _copy_published(plan: Plan, out: Path, staging: Path, dest: Path, command: str, rebuild: str | None) -> list[Path]:
    """`publish`'s files written into ``staging``; returns where they will be once it is swapped into ``dest``."""
    import shutil

    written: list[Path] = []
    for path in sorted(out.iterdir()):
        if path.is_file() and path.suffix in (".md", ".csv", ".png", ".json", ".toml"):
            shutil.copy2(path, staging / path.name)
            written.append(dest / path.name)
    # the preset as the publishing command names it (relative to the working folder), not the path of the
    # folder the runs were trained from
    if (staging / ABLATION_FILE).is_file():
        state = read_json(staging / ABLATION_FILE)
        state["config"] = shown_path(plan.config_path)
        write_json(staging / ABLATION_FILE, state)
    owners = plan.owners(plan.cells())
    trained_at: dict[str, list[str]] = {}  # the commits that trained each run (summary.json)
    trained_on: dict[str, list[str]] = {}  # the machines
    records: dict[str, Path] = {}  # cells/<run>/<file> -> the run's own file, packed into cells.tar.xz
    for run_id in sorted(set(owners.values())):
        run_dir = out / CELLS_DIR / run_id
        if cell_status(run_dir) != "finished":
            continue
        for name in PUBLISHED_RUN_FILES:
            if (run_dir / name).is_file():
                records[f"{CELLS_DIR}/{run_id}/{name}"] = run_dir / name
        summary = read_summary_object(run_dir)
        versions = summary.get("code_versions") or ["not recorded"]
        trained_at.setdefault(" then ".join(f"`{v}`" for v in versions), []).append(run_id)
        trained_on.setdefault(" then ".join(summary.get("machines") or [NOT_RECORDED]), []).append(run_id)
    pack_files(records, staging / CELLS_ARCHIVE)
    written.append(dest / CELLS_ARCHIVE)
    published_at = code_version()
    (staging / VERSIONS_FILE).write_text(installed_versions(published_at), encoding="utf-8")
    if rebuild is None:
        rebuild = f"gastric-fl ablate --config {shown_path(plan.config_path)} --out {shown_path(dest)} --tables-only"
    machines = describe_machines(trained_on)
    (staging / COMMAND_FILE).write_text(
        "# How these tables were made\n\n"
        f"```bash\n{command}\n```\n\n"
        f"Published at git commit `{published_at}`. {describe_code_versions(trained_at)} "
        f"{machines + ' ' if machines else ''}"
        f"Package versions: [{VERSIONS_FILE}]({VERSIONS_FILE}). "
        "Each run's `config.toml`, `summary.json`, "
        f"`metrics.jsonl` and `aggregation.jsonl` are in `{CELLS_ARCHIVE}` (`tar -xJf {CELLS_ARCHIVE}` unpacks "
        f"them into `{CELLS_DIR}/`); the tables are rebuilt from them alone (no training) by\n\n"
        f"```bash\n{rebuild}\n```\n",
        encoding="utf-8",
    )
    return [*written, dest / VERSIONS_FILE, dest / COMMAND_FILE]
