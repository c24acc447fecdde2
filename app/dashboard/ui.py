"""Streamlit pieces shared by the pages: the data root, dataset/run pickers kept across pages, status banners,
the guard that keeps tracebacks off a page and the fragments made under it, tile images with alt text, and the
plain-words explanations.

The pages stay thin: they call the plain modules (``datasets``, ``runs``, ``settings``, ``jobs``) and lay out
what those return with the helpers below.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec

import streamlit as st

from app.dashboard import commands, jobs, paths, presets
from app.dashboard.fields import model_units
from app.datasets import PreparedDataset, list_datasets, load_manifest
from app.errors import DashboardError
from app.evaluation.tables import FLAG_HELP, verdict_word
from app.evaluation.verdict import CANNOT_JUDGE, FAIL, PASS, REVIEW, Floor
from app.run_records import RunInfo, list_runs
from infra import provenance

P = ParamSpec("P")

# Keys in st.session_state shared between pages, so that a dataset or run picked on one page stays picked.
VIEWS = Path(__file__).parent / "views"
DATASET_KEY = "selected_dataset"
RUN_KEY = "selected_run"

STATUS_ICONS = {
    "running": ":material/progress_activity:",
    "finished": ":material/check_circle:",
    "failed": ":material/error:",
    "stopped": ":material/stop_circle:",
}
DAMAGED_MARK = "⚠ damaged"

# One sentence each, for help= tooltips and captions: what a clinician needs to read the figures.
EXPLAIN = {
    "AUC": "AUC (area under the ROC curve): the chance that the model gives a randomly chosen abnormal tile a higher "
    "probability than a randomly chosen normal tile; 1 is a perfect ranking, 0.5 a coin toss, whatever the threshold.",
    "ROC": "ROC curve: for every possible threshold, the share of abnormal tiles caught (sensitivity, up) against the "
    "share of normal tiles wrongly flagged (1 - specificity, right); the closer to the top-left corner, the better.",
    "confusion": "Confusion matrix: at the chosen threshold, how many tiles of each true class (rows) the model called "
    "normal or abnormal (columns); the diagonal holds the right calls.",
    "threshold": "Threshold: a tile is called abnormal when the model's probability of abnormal is at least this "
    "value; lower it to catch more abnormal tiles at the cost of more false alarms.",
    "sensitivity": "Sensitivity: the share of truly abnormal tiles that the model calls abnormal at the threshold.",
    "specificity": "Specificity: the share of truly normal tiles that the model calls normal at the threshold.",
    "accuracy": "Accuracy: the share of all test tiles called right at the threshold.",
    "target": "The sensitivity you need: for each hospital, the highest threshold that reaches it, and the specificity "
    "that threshold leaves.",
}


@contextlib.contextmanager
def page_guard(page: str) -> Iterator[None]:
    """Keep tracebacks off the page: an exception in the block (or in a function it decorates, e.g. a fragment)
    becomes one ``st.error`` line and a hint, and the traceback goes to stderr (the terminal of ``gastric-fl
    dashboard``). A ``DashboardError`` is already one line for the user and is shown as it is.

    Streamlit's own control flow (``st.stop``, ``st.rerun``, ``st.switch_page``) raises ``BaseException``
    subclasses, which pass through untouched. Use it as ``with ui.page_guard("Hospital"):`` or as a decorator,
    ``@ui.page_guard("Federation")``.
    """
    try:
        yield
    except DashboardError as exc:
        st.error(str(exc), icon=":material/error:")
    except Exception as exc:
        print(f"gastric-fl dashboard: the {page} page stopped on an error:", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        st.error(f"The {page} page could not be drawn ({detail}).", icon=":material/error:")
        st.caption(
            "Reload the page or pick another run or dataset; the details are in the terminal that runs "
            "`gastric-fl dashboard`."
        )


def fragment(page: str, body: Callable[P, None], run_every: float | None = None) -> Callable[P, None]:
    """``st.fragment`` of ``body`` (refreshed every ``run_every`` seconds when given) under `page_guard`.

    A fragment's own reruns (its timer, its widgets) run only the fragment, not the page around it, so the page's
    guard does not cover them; every page makes its fragments here, so none of them can put a traceback on screen.
    """
    guarded: Callable[P, None] = page_guard(page)(body)
    return st.fragment(run_every=run_every)(guarded)


def root() -> Path:
    """The data root (``--data``)."""
    return paths.data_root()


def jobs_dir() -> Path:
    """Where the dashboard keeps its background-job records."""
    return paths.jobs_root(root())


def quickstart_commands(data: Path) -> str:
    """The commands that make the demo dataset and a first run by hand (the Data page's button runs the first two)."""
    lines = [shlex.join(c) for c in commands.demo_commands(data, ["gastric-fl"])]
    prepared = data / "prepared" / commands.DEMO_NAME
    run = data / "runs" / "demo"
    lines.append(
        shlex.join(["gastric-fl", "train", "--config", "configs/demo.toml", "--data", str(prepared), "--out", str(run)])
    )
    return "\n".join(lines)


def chosen_by_app(shared: str) -> str:
    """The session key that marks ``st.session_state[shared]`` as set by the app (a run it just started), not by
    the user's own choice in a picker."""
    return f"{shared}:by_app"


def _sticky_select(
    label: str, options: list[str], shared: str, key: str, *, follow: bool = True, **kwargs: object
) -> str:
    """A selectbox whose choice is shared across pages (``st.session_state[shared]``) and follows the app when it
    sets that value (e.g. to a run it just started; not with ``follow=False``), while the user's own choice wins
    when they change it."""
    wanted = st.session_state.get(shared)
    if follow and wanted in options:
        st.session_state[key] = wanted
    elif st.session_state.get(key) not in options:
        st.session_state[key] = options[0]

    def remember() -> None:
        st.session_state[shared] = st.session_state[key]
        st.session_state.pop(chosen_by_app(shared), None)  # the user's choice now

    choice = st.selectbox(label, options, key=key, on_change=remember, **kwargs)  # type: ignore[call-overload]
    return str(choice)


def pick_dataset(label: str = "Prepared dataset", key: str = "dataset_picker") -> PreparedDataset | None:
    """A dataset picker remembered across pages; ``None`` when there is none yet."""
    datasets = list_datasets(paths.prepared_root(root()))
    if not datasets:
        return None
    names = [d.name for d in datasets]
    name = _sticky_select(label, names, DATASET_KEY, key, help=f"Folders under {paths.prepared_root(root())}")
    return datasets[names.index(name)]


def intended_use(dataset: Path | None) -> None:
    """The line every result page carries: research use only, and synthetic slides when they are
    (`infra.provenance`)."""
    st.caption(provenance.intended_use(dataset))


def run_label(info: RunInfo) -> str:
    """How a run appears in pickers: its id and algorithm (its status, which changes, is shown beside it), marked
    when one of its files is damaged."""
    label = f"{info.run_id} · {info.algorithm or '?'}"
    return f"{label} · {DAMAGED_MARK}" if info.damaged else label


def display_status(info: RunInfo) -> str:
    """The run's status, corrected by what the dashboard knows of the process that writes it.

    A damaged run (``info.problem``) shows as ``failed``: its files cannot be trusted until it is resumed or
    deleted, and pages that report failed runs then name the damaged file (``info.error`` carries it).
    """
    if info.damaged:
        return "failed"
    job = jobs.for_target(jobs_dir(), info.path)
    job_state = jobs.state(jobs_dir(), job) if job else None
    return jobs.run_status(info.status, job_state, jobs.pid_alive(info.pid, info.pid_started) if job is None else None)


def pick_run(
    runs: list[RunInfo], label: str = "Run", key: str = "run_picker", *, finished_first: bool = False
) -> RunInfo | None:
    """A run picker remembered across pages (newest first).

    ``finished_first`` (the pages that judge a run's models): finished runs lead the list, so the default is the
    newest finished run, and a run the app chose because it was just started from the Federation page (stopped or
    still partial) does not replace it; a run the user picked stays picked.
    """
    if not runs:
        return None
    follow = True
    if finished_first:
        finished = [r for r in runs if display_status(r) == "finished"]
        runs = finished + [r for r in runs if display_status(r) != "finished"]
        wanted = st.session_state.get(RUN_KEY)
        if finished and st.session_state.get(chosen_by_app(RUN_KEY)) and wanted not in {r.run_id for r in finished}:
            follow = False
    ids = [r.run_id for r in runs]
    chosen = _sticky_select(
        label, ids, RUN_KEY, key, follow=follow, format_func=lambda i: run_label(runs[ids.index(i)])
    )
    return runs[ids.index(chosen)]


def all_runs() -> list[RunInfo]:
    """Every run under the data root's ``runs/``, newest first."""
    return list_runs(paths.runs_root(root()))


def finished_run_exists() -> bool:
    """Whether a finished run with hospital predictions exists (the dashboard then opens on the Verdict page)."""
    from app.run_predictions import prediction_files

    return any(r.status == "finished" and not r.damaged and prediction_files(r.path) for r in all_runs())


def terminal_busy() -> str | None:
    """A run started from a terminal that is still training (its ``summary.json`` pid is alive), if any."""
    records = jobs_dir()
    for info in all_runs():
        started_here = jobs.for_target(records, info.path) is not None
        if info.status == "running" and not started_here and jobs.pid_alive(info.pid, info.pid_started):
            return f"run {info.run_id} (started from a terminal) is still training"
    return None


def num_hospitals(dataset: Path) -> int | None:
    """How many hospitals a prepared dataset has, or None (with one line naming its damaged manifest)."""
    try:
        return int(load_manifest(dataset)["client"].nunique())
    except DashboardError as exc:
        st.error(str(exc), icon=":material/error:")
        return None


ENGINE_DEFAULTS = "(engine defaults)"


def pick_preset(
    column: Any, key: str, help: str, on_change: Callable[[], None] | None = None
) -> tuple[Path | None, dict[str, Any], int]:
    """A preset picker in ``column`` (a Streamlit container; the engine's defaults are the last choice): the
    preset chosen (None for the defaults), its resolved settings (with a warning if it cannot be read) and the
    number of units of its model."""
    choice = column.selectbox(
        "Preset",
        [*(str(p) for p in presets.presets()), ENGINE_DEFAULTS],
        format_func=lambda p: p if p == ENGINE_DEFAULTS else Path(p).name,
        on_change=on_change,
        key=key,
        help=help,
    )
    preset = None if choice == ENGINE_DEFAULTS else Path(choice)
    resolved, problem = presets.resolve_preset(preset)
    if problem:
        st.warning(problem, icon=":material/warning:")
    return preset, resolved, model_units(presets.model_of(resolved))


def no_dataset_help() -> None:
    """What to do when there is no prepared dataset yet."""
    st.info(
        "No prepared dataset yet. Open the **Data** page and press **Generate demo data**, or prepare your own "
        "slides with `gastric-fl prepare` (see data/README.md).",
        icon=":material/info:",
    )
    st.page_link(str(VIEWS / "data.py"), label="Go to the Data page", icon=":material/arrow_forward:")


def no_runs_help() -> None:
    """What to do when there is no run yet: the button and the exact command."""
    st.info(
        "No runs yet. Start one on the **Federation** page, or from a terminal:",
        icon=":material/info:",
    )
    st.code(quickstart_commands(root()), language="bash")
    st.page_link(str(VIEWS / "federation.py"), label="Go to the Federation page", icon=":material/arrow_forward:")


def status_banner(info: RunInfo) -> str:
    """Show a run's state (running, finished, failed with its error, stopped, or the one line naming its damaged
    file); returns the status shown."""
    if info.damaged:
        st.error(f"Run **{info.run_id}** cannot be read completely: {info.problem}", icon=":material/error:")
        return display_status(info)
    job = jobs.for_target(jobs_dir(), info.path)
    job_state = jobs.state(jobs_dir(), job) if job else None
    status = display_status(info)
    if status == "failed":
        message = info.error
        if not message and job is not None:
            message = jobs.log_tail(job, 12) or f"exit code {job_state.exit_code if job_state else '?'}"
        st.error(f"Run **{info.run_id}** failed:\n\n```\n{message or 'no error message recorded'}\n```", icon="🚨")
    elif status == "stopped":
        resume = f"gastric-fl train --resume {info.path}"
        st.warning(
            f"Run **{info.run_id}** was stopped before it finished. Continue it with `{resume}`.",
            icon=":material/stop_circle:",
        )
    elif status == "finished":
        from app.run_records import load_summary
        from federation.runfiles import left_out_lines

        missing = left_out_lines(load_summary(info.path))  # who the run ended without (train exited 3)
        if missing:
            named = "\n".join(f"- {line}" for line in missing)
            st.warning(f"Run **{info.run_id}** finished without every hospital:\n\n{named}", icon=":material/warning:")
        else:
            st.success(f"Run **{info.run_id}** finished.", icon=":material/check_circle:")
    return status


def tile_image(path: Path, caption: str, alt: str) -> None:
    """One tile image with a visible ``caption`` (markdown) and ``alt`` text for screen readers; a missing or
    unreadable file becomes a caption saying so instead of an error."""
    from PIL import Image, UnidentifiedImageError

    try:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError):  # PIL raises SyntaxError for some bad files
        st.caption(f"cannot read {path.name}; {caption}")
        return
    st.image(data, caption=caption, alt=alt, width="stretch")


# --- the clinical floor and the verdicts' badges and tables, shared by the pages --------------------------------------

FLOOR_KEYS = {"sensitivity": "floor_sensitivity", "min_slides": "floor_min_slides", "specificity": "floor_specificity"}


def floor_controls(page: str) -> Floor:
    """The clinical floor's three inputs (sensitivity at the operating threshold, minimum test slides, specificity
    below which a passing model goes to review), remembered across pages: each page's widgets start from the shared
    values (plain session keys, which Streamlit keeps when a page is left) and write back to them."""
    default = Floor()
    fields = (
        ("sensitivity", "Floor: sensitivity", float(default.sensitivity), 0.01, 1.0, 0.05, "%.2f",
         "The sensitivity a hospital's model must reach at its operating threshold, on tiles and on abnormal slides."),
        ("min_slides", "Floor: minimum test slides", int(default.min_slides), 1, 1000, 1, None,
         "Below this many test slides a hospital cannot be judged: tiles of one slide are not independent."),
        ("specificity", "Review below specificity", float(default.specificity), 0.0, 1.0, 0.05, "%.2f",
         "A model that meets the sensitivity floor but calls more normal tiles abnormal than this goes to review."),
    )  # fmt: skip
    values: dict[str, float | int] = {}
    for column, (name, label, start, low, high, step, fmt, help_text) in zip(st.columns(3), fields, strict=True):
        shared, widget = FLOOR_KEYS[name], f"{page}_{FLOOR_KEYS[name]}"
        st.session_state[widget] = st.session_state.get(shared, start)

        def remember(shared: str = shared, widget: str = widget) -> None:
            st.session_state[shared] = st.session_state[widget]

        kwargs: dict[str, Any] = {"format": fmt} if fmt else {}
        values[name] = column.number_input(
            label, min_value=low, max_value=high, step=step, key=widget, on_change=remember, help=help_text, **kwargs
        )
    return Floor(float(values["sensitivity"]), int(values["min_slides"]), float(values["specificity"]))


# A verdict's colour and word (Streamlit's background colours; the word alone carries the meaning, so a screen reader
# hears "Hospital 0 FAIL" and no icon name).
VERDICT_COLOURS = {
    PASS: "green",
    REVIEW: "orange",
    FAIL: "red",
    CANNOT_JUDGE: "gray",
}


def verdict_badge(kind: str, floor: Floor | None = None) -> str:
    """The verdict ``kind`` as markdown: its word in bold on its colour, with the floor when it is lowered below
    the default (`app.evaluation.tables.verdict_word`)."""
    return f":{VERDICT_COLOURS[kind]}-background[**{verdict_word(kind, floor)}**]"


def current_floor() -> Floor:
    """The clinical floor as last set on the Verdict or Hospital page (`floor_controls`' shared session values),
    without drawing its inputs: the Federation and Compare pages and the downloaded HTML report judge with it;
    the default floor when none was set (or a stored value is out of range)."""
    default = Floor()
    try:
        return Floor(
            float(st.session_state.get(FLOOR_KEYS["sensitivity"], default.sensitivity)),
            int(st.session_state.get(FLOOR_KEYS["min_slides"], default.min_slides)),
            float(st.session_state.get(FLOOR_KEYS["specificity"], default.specificity)),
        )
    except (TypeError, ValueError):
        return default


def verdict_table(table: Any, key: str, floor: Floor) -> None:
    """`app.evaluation.tables.verdict_summary` (with a ``run`` column on the Compare page) as a table with sensible
    precision, and the floor it was judged against named under it."""
    number = st.column_config.NumberColumn
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key=key,
        column_config={
            "hospital": st.column_config.TextColumn("hospital", pinned=True),
            "threshold": number("threshold", format="%.2f", help="the threshold its model card decides with"),
            "sensitivity": number("sensitivity", format="%.2f", help=EXPLAIN["sensitivity"]),
            "specificity": number("specificity", format="%.2f", help=EXPLAIN["specificity"]),
            "AUC": number("AUC", format="%.3f", help=EXPLAIN["AUC"]),
            "test slides": number("test slides", format="%d"),
            **{
                name: st.column_config.TextColumn(name, help=words)
                for name, words in FLAG_HELP.items()  # the held-out slides reported UNFAMILIAR or with a focus
            },
        },
    )
    st.caption(
        f"Each hospital at the threshold its model card decides with, judged against the floor ({floor.words}; set "
        "it on the Verdict page, which gives each verdict's reason)."
    )


def chart(where: Any, figure: Any, key: str, **kwargs: Any) -> Any:
    """``where.plotly_chart(figure)`` (``where``: ``st`` or a column) with its text alternative: ``alt`` as given,
    else `app.dashboard.charts.describe` of the figure, so that no chart is only a picture."""
    from app.dashboard import charts

    alt = kwargs.pop("alt", None) or charts.describe(figure)
    return where.plotly_chart(figure, key=key, alt=alt, **kwargs)
