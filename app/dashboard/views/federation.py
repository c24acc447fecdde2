"""Federation page: choose the algorithm (FedSAF by default) and its settings, start a run in the background,
stop it, and watch it live: round k of K, time left, each hospital's test AUC and accuracy, the averaged and std
curves, values transmitted and the AMP matrix xi (FedSAF paper, Algorithm 1; Eq. 1, 3-8, 16-20, 23-25)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.dashboard import charts, jobs, paths, settings, ui
from app.dashboard.datasets import load_manifest
from app.dashboard.errors import DashboardError
from app.dashboard.runs import (
    RunInfo,
    format_seconds,
    latest_per_client,
    load_aggregation,
    load_metrics,
    per_client,
    per_round,
    progress,
    run_info,
    xi_matrices,
)

SETTING_KEYS = ("algorithm", "rounds", "local_epochs", "lr", "nhead", "dm", "fim", "split", "lam", "sigma", "alpha_k")
REFRESH_S = 2.0

st.title("Federation")
st.caption(
    "Each hospital trains on its own tiles; only the shared layers travel. Settings are checked before anything "
    "starts, and the run continues in the background if you close or reload this page."
)

root = ui.root()
jobs_dir = ui.jobs_dir()


@st.cache_resource(show_spinner=False)
def _units(model_name: str) -> int:
    return settings.model_units(model_name)


@st.cache_data(show_spinner=False)
def _preset(path: str | None) -> dict[str, object]:
    return settings.load_preset(Path(path) if path else None)


def _reset_settings() -> None:
    # A new preset brings new defaults: forget the values typed for the old one.
    for key in SETTING_KEYS:
        st.session_state.pop(key, None)


def _fmt_algorithm(name: str) -> str:
    return settings.ALGORITHM_NAMES.get(name, name)


# --- start a run ----------------------------------------------------------------------------------------------

with st.expander("Start a new federation", expanded=True, icon=":material/play_circle:"):
    top = st.columns(3)
    with top[0]:
        dataset = ui.pick_dataset("Dataset")
    if dataset is None:
        ui.no_dataset_help()
    else:
        try:
            num_clients: int | None = int(load_manifest(dataset.path)["client"].nunique())
        except DashboardError as exc:
            st.error(str(exc))
            num_clients = None
        engine_defaults = "(engine defaults)"
        preset_choice = top[1].selectbox(
            "Preset",
            [*(str(p) for p in settings.presets()), engine_defaults],
            format_func=lambda p: p if p == engine_defaults else Path(p).name,
            on_change=_reset_settings,
            key="preset",
            help="A training preset in configs/; the settings below override it.",
        )
        preset_path = None if preset_choice == engine_defaults else Path(preset_choice)
        resolved = _preset(str(preset_path) if preset_path else None)
        defaults = settings.defaults_from(resolved)
        model_table = resolved.get("model")
        model_name = str(model_table.get("name")) if isinstance(model_table, dict) else "mobilenet_v3_small"
        units = _units(model_name)

        algorithm = top[2].selectbox(
            "Algorithm",
            settings.ALGORITHMS,
            index=settings.ALGORITHMS.index("fedsaf"),
            format_func=_fmt_algorithm,
            key="algorithm",
        )
        c1, c2, c3 = st.columns(3)
        rounds = int(c1.number_input("Rounds", value=defaults.rounds, step=1, key="rounds"))
        local_epochs = int(c2.number_input("Local epochs", value=defaults.local_epochs, step=1, key="local_epochs"))
        lr = float(c3.number_input("Learning rate", value=defaults.lr, step=0.001, format="%.4f", key="lr"))

        values = {"algorithm": algorithm, "rounds": rounds, "local_epochs": local_epochs, "lr": lr}
        if algorithm in settings.NHEAD_ALGORITHMS or algorithm in settings.AMP_ALGORITHMS:
            st.markdown("**FedSAF settings**" if algorithm == "fedsaf" else f"**{_fmt_algorithm(algorithm)} settings**")
            c1, c2, c3, c4 = st.columns(4)
            if algorithm in settings.NHEAD_ALGORITHMS:
                values["nhead"] = int(
                    c1.number_input(
                        "nhead (local layers)",
                        value=settings.default_nhead(algorithm) if algorithm != defaults.algorithm else defaults.nhead,
                        step=1,
                        key="nhead",
                        help=f"Layer units kept in the hospital, counted from the output (0-{units}; paper Eq. 1).",
                    )
                )
            if algorithm in settings.AMP_ALGORITHMS:
                values["dm"] = c2.selectbox(
                    "Distance dm",
                    settings.DISTANCES,
                    index=settings.DISTANCES.index(defaults.dm) if defaults.dm in settings.DISTANCES else 0,
                    key="dm",
                    help="How similar two hospitals' shared layers are (paper Eq. 3-8). cosine uses the "
                    "similarity as the paper writes it; cosine_distance uses 1 - similarity.",
                )
                values["sigma"] = float(
                    c3.number_input("sigma", value=defaults.sigma, step=0.01, format="%.4f", key="sigma")
                )
                values["alpha_k"] = float(
                    c4.number_input(
                        "alpha_k",
                        value=defaults.alpha_k,
                        step=0.005,
                        format="%.4f",
                        key="alpha_k",
                        help="Message-passing step; alpha_k x (hospitals - 1) must not exceed sigma.",
                    )
                )
                c1, c2, c3, _ = st.columns(4)
                values["lam"] = float(
                    c1.number_input(
                        "lambda",
                        value=defaults.lam,
                        step=0.1,
                        format="%.3f",
                        key="lam",
                        help="Pull of each hospital's shared layers towards its message (paper Eq. 25).",
                    )
                )
            if algorithm in settings.FEDSAF_ONLY:
                values["fim"] = c2.toggle("Fisher reweighting (FIM)", value=defaults.fim, key="fim")
                values["split"] = c3.toggle("Model splitting", value=defaults.split, key="split")
        chosen = settings.FederationSettings(**{**defaults.__dict__, **values})

        problems = settings.validate(chosen, num_clients, units)
        run_id = settings.new_run_id(algorithm, {r.run_id for r in ui.all_runs()})
        run_dir = paths.runs_root(root) / run_id
        command = settings.train_command(preset_path, dataset.path, run_dir, chosen)
        with st.popover("Same run from a terminal", icon=":material/terminal:"):
            st.code(" ".join(["gastric-fl", *command[3:]]), language="bash", wrap_lines=True)
        if st.button("Start federation", type="primary", icon=":material/play_arrow:", key="start"):
            if not problems:
                engine_problem = settings.engine_check(preset_path, dataset.path, chosen)
                if engine_problem:
                    problems = [engine_problem]
            if problems:
                st.error("Not started. " + " ".join(problems), icon=":material/block:")
            else:
                try:
                    jobs.start(jobs_dir, run_id, "train", run_dir, [command], cwd=settings.PROJECT_ROOT)
                except DashboardError as exc:
                    st.error(str(exc))
                else:
                    st.session_state[ui.RUN_KEY] = run_id
                    st.session_state["pending_run"] = run_id
                    st.rerun()
        elif problems:
            st.warning(" ".join(problems), icon=":material/warning:")

# --- a run that is starting (no folder yet) or failed before writing one ------------------------------------


def _pending(run_id: str) -> None:
    """Between "Start" and the run's folder appearing (the engine imports torch and loads the data first)."""
    job = jobs.load(jobs_dir, run_id)
    if job is None:
        return
    job_state = jobs.state(jobs_dir, job)
    if (paths.runs_root(root) / run_id / "config.toml").is_file():
        st.session_state.pop("pending_run", None)
        st.rerun()  # the folder exists now: show the run below, with its live refresh
    if not job_state.active:
        st.error(f"Run **{run_id}** did not start (exit code {job_state.exit_code}):", icon="🚨")
        st.code(jobs.log_tail(job, 12) or "no output", language="text")
        return
    st.info(f"Starting run **{run_id}**: loading the model and the hospitals' tiles…", icon=":material/hourglass_top:")
    st.code(jobs.log_tail(job, 4) or jobs.describe(job), language="text")


pending = st.session_state.get("pending_run")
if pending:
    st.fragment(run_every=REFRESH_S)(_pending)(pending)

# --- watch a run ----------------------------------------------------------------------------------------------

st.subheader("Runs")
runs = ui.all_runs()
if not runs:
    ui.no_runs_help()
    st.stop()
selected = ui.pick_run(runs, "Run to watch")
assert selected is not None  # runs is not empty
initial_status = ui.display_status(selected)


def _monitor(info: RunInfo) -> None:
    info = run_info(info.path, info.run_id)  # re-read: the run moves on between refreshes
    status = ui.status_banner(info)
    job = jobs.for_target(jobs_dir, info.path)
    metrics = load_metrics(info.path)
    state = progress(info.path, info.rounds_total, metrics=metrics)
    rounds = per_round(metrics)

    top = st.columns([4, 1], vertical_alignment="bottom")
    text = f"Round {state.rounds_done} of {state.rounds_total or '?'}"
    if status == "running":
        text += f" · about {format_seconds(state.seconds_left)} left" if state.seconds_left is not None else ""
    top[0].progress(state.fraction, text=text)
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
    last = rounds.iloc[-1]
    cols = st.columns(5)
    cols[0].metric("Round", f"{state.rounds_done} / {state.rounds_total or '?'}")
    cols[1].metric("Averaged AUC", f"{last['auc_mean']:.3f}", help="mean over hospitals with both classes")
    cols[2].metric("Averaged ACC", f"{last['acc_mean']:.3f}")
    cols[3].metric("Values transmitted", f"{last['values_total']:,.0f}", help="both directions, all rounds so far")
    cols[4].metric("Elapsed", format_seconds(state.seconds_elapsed) if status == "running" else "—")

    st.markdown("**Each hospital, latest round**")
    st.dataframe(
        latest_per_client(metrics),
        hide_index=True,
        width="stretch",
        key="latest_table",
        column_config={
            "test AUC": st.column_config.NumberColumn(format="%.4f"),
            "test ACC": st.column_config.NumberColumn(format="%.4f"),
            "test loss": st.column_config.NumberColumn(format="%.4f"),
            "train loss": st.column_config.NumberColumn(format="%.4f"),
            "fisher trace": st.column_config.NumberColumn(format="%.4g"),
        },
    )

    left, right = st.columns(2)
    left.plotly_chart(
        charts.per_hospital(per_client(metrics, "test_auc"), "Test AUC per hospital", "AUC"), key="auc_chart"
    )
    right.plotly_chart(
        charts.per_hospital(per_client(metrics, "test_acc"), "Test accuracy per hospital", "accuracy"),
        key="acc_chart",
    )
    left, right = st.columns(2)
    left.plotly_chart(charts.mean_std(rounds, "auc", "Averaged and std AUC", "AUC"), key="auc_mean_chart")
    right.plotly_chart(charts.mean_std(rounds, "acc", "Averaged and std accuracy", "accuracy"), key="acc_mean_chart")
    left, right = st.columns(2)
    left.plotly_chart(charts.transmitted(rounds), key="values_chart")
    matrices = xi_matrices(load_aggregation(info.path))
    with right:
        if matrices:
            numbers = sorted(matrices)
            chosen_round = numbers[-1]
            if len(numbers) > 1:
                chosen_round = st.select_slider(
                    "AMP round", numbers, value=numbers[-1], key=f"xi_round_{info.run_id}_{numbers[-1]}"
                )
            st.plotly_chart(charts.xi_heatmap(matrices[chosen_round], chosen_round), key="xi_chart")
        else:
            st.info("No AMP matrix ξ for this run: only FedSAF and FedAMP pass attentive messages.")
    if status != initial_status:
        st.rerun()  # finished, failed or stopped: redraw the page once, without the timer


if initial_status == "running":
    st.fragment(run_every=REFRESH_S)(_monitor)(selected)
else:
    _monitor(selected)
