"""Federation page: choose the method (FedSAF by default) and its settings, start a run in the background, stop
it, and watch it live: round k of K and the step within the round, time left, each hospital's test AUC and
accuracy, the averaged and std curves, values transmitted and the AMP matrix xi (FedSAF paper, Algorithm 1;
Eq. 1, 3-8, 16-20, 23-25). A hospital whose last-round AUC is high while its accuracy is low gets one sentence
sending it to the Hospital page's scorecard (``app.evaluation.words.accuracy_warning``).

The form leads with the plain settings (dataset, method, rounds, seed, local epochs, learning rate); the method's
hyper-parameters and the settings every method shares sit under "Advanced". Each field has the limits of
``federation.config``, and every invalid field gets its own message from the engine's own checks
(``checks.check``, which imports no torch: the page neither shows its content nor settles after a torch
import). The checks and the Start button are drawn last, into their place below the form. *Start federation*
stays disabled while a setting is invalid or while a training runs (``jobs.start_training``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from app.dashboard import charts, checks, commands, fields, jobs, live, paths, presets, ui
from app.datasets import PreparedDataset
from app.errors import DashboardError
from app.evaluation.classes import is_multi_class, not_applicable
from app.evaluation.tables import verdict_summary
from app.evaluation.words import latest_accuracy_warnings
from app.run_predictions import prediction_files, run_classes
from app.run_records import (
    RunInfo,
    format_seconds,
    latest_per_hospital,
    load_aggregation,
    load_metrics,
    per_hospital,
    per_round,
    progress,
    run_info,
    run_seconds,
    xi_matrices,
)
from app.verdicts import judge_run
from federation.progress import read_progress
from federation.runfiles import CONFIG_FILE

REFRESH_S = 2.0
FORM_PREFIX = "cfg:"
COLUMNS = 3

st.title("Federation")
st.caption(
    "Each hospital trains on its own tiles; only the shared layers travel. Settings are checked before anything "
    "starts, and the run continues in the background if you close or reload this page."
)

root = ui.root()
jobs_dir = ui.jobs_dir()


def busy_reason() -> str | None:
    """Why no new training may start now: one is running (from this page, the queue or a terminal)."""
    job = jobs.active_train(jobs_dir)
    if job is not None:
        return f"{job.title or job.job_id} is still training"
    return ui.terminal_busy()


jobs.ensure_runner(jobs_dir, presets.PROJECT_ROOT, ui.terminal_busy)  # the Compare page's queue keeps moving


def _reset_form() -> None:
    # A new preset brings new defaults: forget the values typed for the old one.
    for key in [k for k in st.session_state if str(k).startswith(FORM_PREFIX)]:
        del st.session_state[key]


def widget_key(item: fields.Field, method: str) -> str:
    """The form key of a field; the method's own hyper-parameters are kept per method (``cfg:fedsaf:amp.sigma``),
    so switching methods brings each method's defaults (e.g. its own ``nhead``)."""
    if item.group == "method":
        return f"{FORM_PREFIX}{method}:{item.key}"
    return f"{FORM_PREFIX}{item.key}"


def _widget(item: fields.Field, value: Any, method: str, units: int) -> Any:
    """Draw one field with its limits; returns its value."""
    key = widget_key(item, method)
    if item.kind == "bool":
        return st.toggle(item.label, value=bool(value), key=key, help=item.help)
    if item.kind == "choice":
        index = item.options.index(value) if value in item.options else 0
        names = fields.ALGORITHM_NAMES if item.key == "strategy.name" else {}
        options: list[str] = list(item.options)
        return st.selectbox(
            item.label, options, index=index, key=key, help=item.help, format_func=lambda o: names.get(o, o)
        )
    if item.kind == "list":
        chosen = [v for v in (value or []) if v in item.options]
        return st.multiselect(item.label, item.options, default=chosen, key=key, help=item.help)
    low, high = fields.limits(item, units)
    if item.kind == "int":
        number = int(value) if isinstance(value, int | float) else int(low or 0)
        low_i = None if low is None else min(int(low), number)
        high_i = None if high is None else max(int(high), number)
        return st.number_input(
            item.label, low_i, high_i, number, int(item.step or 1), key=key, help=item.help, format="%d"
        )
    number_f = float(value) if isinstance(value, int | float) else float(low or 0.0)
    low_f = None if low is None else min(float(low), number_f)
    high_f = None if high is None else max(float(high), number_f)
    return st.number_input(
        item.label, low_f, high_f, number_f, float(item.step or 0.01), format=item.fmt, key=key, help=item.help
    )


def _fields(group: str, values: dict[str, Any], initial: dict[str, Any], method: str, units: int) -> None:
    """Draw the fields of ``group`` that the method reads, ``COLUMNS`` per row, writing into ``values``."""
    shown = [f for f in fields.FIELDS if f.group == group and f.key != "strategy.name" and f.applies(values)]
    per_row = len(shown) if group == "plain" else COLUMNS
    for start in range(0, len(shown), per_row):
        columns = st.columns(per_row)
        for column, item in zip(columns, shown[start : start + per_row], strict=False):
            with column:
                values[item.key] = _widget(item, initial.get(item.key), method, units)
                if item.key == "strategy.wrap":  # the wrappers' own settings appear once a step is chosen
                    values[item.key] = list(values[item.key])


@dataclass(frozen=True)
class Form:
    """What the form was filled with, and the place below it where its checks and the Start button go."""

    slot: Any  # a Streamlit container
    preset: Path | None
    resolved: dict[str, Any]
    dataset: PreparedDataset
    values: dict[str, Any]


@ui.page_guard("Federation")
def start_form() -> Form | None:
    """The settings form; its checks and the Start button are drawn by `finish_form` into the returned slot."""
    with st.expander("Start a new federation", expanded=True, icon=":material/play_circle:"):
        top = st.columns(3)
        with top[0]:
            dataset = ui.pick_dataset("Dataset")
        if dataset is None:
            ui.no_dataset_help()
            return None
        preset_path, resolved, units = ui.pick_preset(
            top[1], "preset", "A training preset in configs/; the settings below override it.", _reset_form
        )
        method_field = fields.FIELDS_BY_KEY["strategy.name"]
        with top[2]:
            method = str(_widget(method_field, presets.initial_values(resolved)["strategy.name"], "", units))
        initial = presets.initial_values(resolved, method)
        values: dict[str, Any] = {"strategy.name": method}
        _fields("plain", values, initial, method, units)
        with st.expander(f"Advanced: {fields.SHORT_NAMES[method]}'s hyper-parameters and shared settings"):
            for group in ("method", "shared", "training"):
                if any(f.group == group and f.applies(values) for f in fields.FIELDS):
                    st.markdown(f"**{fields.GROUPS[group]}**")
                    _fields(group, values, initial, method, units)

        return Form(st.container(), preset_path, resolved, dataset, values)


@ui.page_guard("Federation")
def finish_form(form: Form) -> None:
    """The checks of the form's settings, one message per problem, and the Start button (disabled while a setting
    is invalid or a training runs), drawn into their place below the form after the rest of the page."""
    values, dataset = form.values, form.dataset
    method = str(values["strategy.name"])
    with form.slot:
        checked = checks.check(form.preset, dataset.path, values, ui.num_hospitals(dataset.path))
        for message in checked.messages():
            st.error(message, icon=":material/block:")
        busy = busy_reason()
        if busy:
            ui.fragment("Federation", watch_busy, REFRESH_S)()
        waiting = sum(jobs.entry_status(jobs_dir, e) == jobs.QUEUED for e in _queue())
        if waiting:
            st.caption(
                f"{commands.plural(waiting, 'run')} wait in the Compare page's queue; a run started here goes first."
            )
        run_id = commands.new_run_id(method, {r.run_id for r in ui.all_runs()})
        run_dir = paths.runs_root(root) / run_id
        sets = commands.overrides(values, form.resolved)
        command = commands.train_command(form.preset, dataset.path, run_dir, sets)
        title = commands.describe_run(values, dataset.name)
        left, right = st.columns([1, 3], vertical_alignment="center")
        with right.popover("Same run from a terminal", icon=":material/terminal:"):
            st.code(commands.as_typed(command), language="bash", wrap_lines=True)
        start = left.button(
            "Start federation",
            type="primary",
            icon=":material/play_arrow:",
            key="start",
            disabled=not checked.ok or busy is not None,
            help="Fix the settings above first." if not checked.ok else busy,
        )
        if start:
            try:
                jobs.start_training(jobs_dir, run_id, run_dir, command, presets.PROJECT_ROOT, title, ui.terminal_busy)
            except DashboardError as exc:
                st.error(str(exc), icon=":material/block:")
            else:
                st.session_state[ui.RUN_KEY] = run_id
                st.session_state[ui.chosen_by_app(ui.RUN_KEY)] = True
                st.session_state["pending_run"] = run_id
                st.rerun()


def watch_busy() -> None:
    """While a training runs, say so, checked again every ``REFRESH_S``; the moment it has ended (or was stopped),
    redraw the whole page, so that Start is available again without a reload (the run's own view stops refreshing
    when its status changes, which can come a moment before its process has exited)."""
    busy = busy_reason()
    if busy is None:
        st.rerun()
    st.info(f"{busy}: Start is available again when it ends.", icon=":material/hourglass_top:")


def _queue() -> list[jobs.QueueEntry]:
    try:
        return jobs.read_queue(jobs_dir)
    except DashboardError as exc:
        st.warning(str(exc), icon=":material/warning:")
        return []


@ui.page_guard("Federation")
def pending_banner(run_id: str) -> None:
    """Between "Start" and the run's folder appearing (the engine imports torch and loads the data first)."""
    job = jobs.load(jobs_dir, run_id)
    if job is None:
        return
    job_state = jobs.state(jobs_dir, job)
    if (paths.runs_root(root) / run_id / CONFIG_FILE).is_file():
        st.session_state.pop("pending_run", None)
        st.rerun()  # the folder exists now: show the run below, with its live refresh
    title = job.title or f"Run {run_id}"
    if not job_state.active:
        if job_state.status == "stopped":
            st.warning(f"{title} was stopped before its first round.", icon=":material/stop_circle:")
            return
        st.error(f"{title} did not start (exit code {job_state.exit_code}). Its last output:", icon="🚨")
        st.code(jobs.log_tail(job, 12) or "no output", language="text")
        return
    left, right = st.columns([4, 1], vertical_alignment="bottom")
    left.info(f"{title}; follow it below. Loading the model and the hospitals' tiles…", icon=":material/hourglass_top:")
    if right.button("Stop", icon=":material/stop:", key="stop_pending", help="SIGTERM: the run stops cleanly"):
        jobs.stop(jobs_dir, job)
        st.session_state["pending_run"] = run_id  # after a reload too: say that it was stopped
        st.rerun()


def loading_run() -> str | None:
    """The run this page started and is still loading: the session's, or, after a reload (which forgets the
    session), the dashboard's active training whose run folder has no ``config.toml`` yet, so Stop is always there."""
    pending = st.session_state.get("pending_run")
    if pending:
        return str(pending)
    job = jobs.active_train(jobs_dir)
    if job is not None and not (Path(job.target) / CONFIG_FILE).is_file():
        return job.job_id
    return None


# --- watch a run ----------------------------------------------------------------------------------------------


@ui.page_guard("Federation")
def monitor(info: RunInfo, initial_status: str) -> None:
    """Round k of K (and the step within the round), figures and charts of one run; redrawn every
    ``REFRESH_S`` while it runs."""
    info = run_info(info.path, info.run_id)  # re-read: the run moves on between refreshes
    ui.intended_use(info.dataset)
    status = ui.status_banner(info)
    job = jobs.for_target(jobs_dir, info.path)
    metrics = load_metrics(info.path)
    state = progress(info.path, info.rounds_total, metrics=metrics)
    rounds = per_round(metrics)

    top = st.columns([4, 1], vertical_alignment="bottom")
    fraction, text = live.bar(state, read_progress(info.path), status == "running")
    top[0].progress(fraction, text=text)
    stoppable = status == "running" and (job is not None or info.pid is not None)
    if stoppable and top[1].button("Stop", icon=":material/stop:", key="stop", help="SIGTERM: the run stops cleanly"):
        if job is not None:
            jobs.stop(jobs_dir, job)
        elif info.pid is not None:
            jobs.stop_pid(info.pid, info.pid_started)  # a run started from a terminal
        st.rerun()

    if metrics.empty:
        st.info("Waiting for the first round to finish…" if status == "running" else "This run recorded no rounds.")
        if status != initial_status:
            st.rerun()
        return
    classes = run_classes(info.path)
    multi = is_multi_class(classes)
    if multi:
        st.info(
            not_applicable(len(classes), "verdicts, sensitivity and specificity")
            + " Its figures below: accuracy (the class of highest probability) and the macro one-vs-rest AUC.",
            icon=":material/info:",
        )
    elif prediction_files(info.path):  # the verdict first: an averaged AUC never stands above failing hospitals
        floor = ui.current_floor()
        judged = judge_run(info.path, floor).judgements
        if judged:
            st.markdown("**Each hospital's verdict** (its latest round's model)")
            ui.verdict_table(verdict_summary(judged), "verdict_table", floor)
            st.caption("The training's own figures follow: an averaged AUC says how tiles are ranked, not the verdict.")

    last = rounds.iloc[-1]
    cols = st.columns(5)
    cols[0].metric("Round", f"{state.rounds_done} / {state.rounds_total or '?'}")
    auc_help = "macro one-vs-rest; mean over hospitals" if multi else "mean over hospitals with both classes"
    cols[1].metric("Averaged AUC", f"{last['auc_mean']:.3f}", help=auc_help)
    cols[2].metric("Averaged ACC", f"{last['acc_mean']:.3f}")
    cols[3].metric("Values transmitted", f"{last['values_total']:,.0f}", help="both directions, all rounds so far")
    elapsed = state.seconds_elapsed if status == "running" else run_seconds(info.path, metrics)
    took = format_seconds(elapsed) if math.isfinite(elapsed) else "—"
    cols[4].metric("Elapsed" if status == "running" else "Took", took)

    # A high AUC next to a low accuracy is not left without a word (binary runs: the scorecard is for them).
    if not multi:
        warnings = latest_accuracy_warnings(metrics)
        for warning in warnings:
            st.warning(warning, icon=":material/warning:")
        if warnings:
            st.page_link(
                str(ui.VIEWS / "hospital.py"),
                label="Open the Hospital page's scorecard",
                icon=":material/arrow_forward:",
            )

    st.markdown(
        "**Each hospital, latest round** (the training's own figures; "
        + (
            "accuracy by the class of highest probability, AUC macro one-vs-rest)"
            if multi
            else "its accuracy is at threshold 0.50)"
        )
    )
    st.dataframe(
        latest_per_hospital(metrics),
        hide_index=True,
        width="stretch",
        key="latest_table",
        column_config={
            "test AUC": st.column_config.NumberColumn(format="%.3f"),
            "test ACC": st.column_config.NumberColumn(
                "accuracy" if multi else "accuracy at 0.50",
                format="%.3f",
                help="the class of highest probability"
                if multi
                else "at threshold 0.50, whatever the model card's threshold",
            ),
            "test loss": st.column_config.NumberColumn(format="%.3f"),
            "train loss": st.column_config.NumberColumn(format="%.3f"),
            "fisher trace": st.column_config.NumberColumn(format="%.4g"),
        },
    )

    left, right = st.columns(2)
    ui.chart(
        left, charts.per_hospital(per_hospital(metrics, "test_auc"), "Test AUC per hospital", "AUC"), key="auc_chart"
    )
    ui.chart(
        right,
        charts.per_hospital(per_hospital(metrics, "test_acc"), "Test accuracy per hospital", "accuracy"),
        key="acc_chart",
    )
    left, right = st.columns(2)
    ui.chart(left, charts.mean_std(rounds, "auc", "Averaged and std AUC", "AUC"), key="auc_mean_chart")
    ui.chart(right, charts.mean_std(rounds, "acc", "Averaged and std accuracy", "accuracy"), key="acc_mean_chart")
    left, right = st.columns(2)
    ui.chart(left, charts.transmitted(rounds), key="values_chart")
    matrices = xi_matrices(load_aggregation(info.path))
    with right:
        if matrices:
            numbers = sorted(matrices)
            chosen_round = numbers[-1]
            if len(numbers) > 1:
                chosen_round = st.select_slider(
                    "AMP round", numbers, value=numbers[-1], key=f"xi_round_{info.run_id}_{numbers[-1]}"
                )
            ui.chart(st, charts.xi_heatmap(matrices[chosen_round], chosen_round), key="xi_chart")
        else:
            st.info("No AMP matrix ξ for this run: only FedSAF and FedAMP pass attentive messages.")
    if status != initial_status:
        st.rerun()  # finished, failed or stopped: redraw the page once, without the timer


@ui.page_guard("Federation")
def runs_section() -> None:
    """The run picker and the live view of the chosen run."""
    st.subheader("Runs")
    runs = ui.all_runs()
    if not runs:
        ui.no_runs_help()
        return
    selected = ui.pick_run(runs, "Run to watch")
    if selected is None:
        return
    initial_status = ui.display_status(selected)
    if initial_status == "running":
        ui.fragment("Federation", monitor, REFRESH_S)(selected, initial_status)
    else:
        monitor(selected, initial_status)


form = start_form()
pending = loading_run()
if pending:
    ui.fragment("Federation", pending_banner, REFRESH_S)(pending)
runs_section()
if form is not None:
    finish_form(form)
