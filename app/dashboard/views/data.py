"""Data page: pick a prepared dataset (or generate and prepare the synthetic demo); per-hospital counts,
grayscale and tile-size flags, and a grid of sample tiles with captions and alt text (data/README.md section 2)."""

from __future__ import annotations

import time

import streamlit as st

from app.dashboard import commands, jobs, paths, presets, ui
from app.datasets import (
    counts_table,
    dataset_classes,
    hospital_label,
    load_manifest,
    load_prepare_json,
    sample_tiles,
    shortcut_probe,
)
from app.errors import DashboardError

root = ui.root()
jobs_dir = ui.jobs_dir()


def _demo_job() -> jobs.Job | None:
    found = jobs.list_jobs(jobs_dir, kind="demo")
    return found[0] if found else None


def _start_demo() -> None:
    job_id = time.strftime("demo-%Y%m%d-%H%M%S")
    try:
        jobs.start(
            jobs_dir,
            job_id,
            "demo",
            paths.prepared_root(root) / commands.DEMO_NAME,
            commands.demo_commands(root),
            cwd=presets.PROJECT_ROOT,
        )
    except DashboardError as exc:
        st.error(str(exc))


def demo_panel(demo_state: jobs.JobState | None) -> None:
    """The one-button synthetic demo: start it, watch its log, and reload the page when it is ready."""
    job = _demo_job()
    current = jobs.state(jobs_dir, job) if job else None
    with st.container(border=True):
        left, right = st.columns([3, 1], vertical_alignment="center")
        left.markdown(
            "**Synthetic demo.** Generates 24 synthetic SEED-style slides and prepares them into 3 hospitals' "
            "tiles (hospital 2 grayscale), through the same `gastric-fl synth` and `prepare` commands."
        )
        busy = current is not None and current.active
        if right.button("Generate demo data", type="primary", disabled=busy, width="stretch", key="demo_button"):
            _start_demo()
            st.rerun()
        if job is None or current is None:
            return
        if current.active:
            st.info(f"Generating the demo… (`{jobs.describe(job)}`)", icon=":material/hourglass_top:")
            st.code(jobs.log_tail(job, 8) or "starting…", language="text")
        elif current.status == "succeeded" and demo_state is not None and demo_state.active:
            st.session_state[ui.DATASET_KEY] = commands.DEMO_NAME
            st.rerun()  # the dataset exists now: redraw the whole page with it
        elif current.status == "failed":
            st.error(f"Generating the demo failed (exit code {current.exit_code}):")
            st.code(jobs.log_tail(job, 12), language="text")


@ui.page_guard("Data")
def probe_section(record: dict[str, object]) -> None:
    """Whether label-free pixel statistics alone separate the classes (prepare's shortcut probe)."""
    st.subheader("Could a model score well without looking at tissue?")
    probe = shortcut_probe(record)
    if probe is None:
        st.info(
            "This dataset was prepared before prepare measured shortcuts; prepare it again to see whether simple "
            "pixel statistics alone separate its classes.",
            icon=":material/info:",
        )
        return
    if probe.departure:
        st.warning(f"Departure from raw tissue: {probe.departure}.", icon=":material/warning:")
    if probe.warning:
        st.warning(probe.warning, icon=":material/warning:")
    else:
        st.caption(f"No single pixel statistic separates the classes above AUC {probe.limit:.2f} on any split.")
    st.caption(
        "AUC of one pixel statistic used alone as the score (0.5: tells nothing; 1.0: separates the classes "
        "perfectly). A high value means a model can be right for a reason other than the disease."
    )
    st.dataframe(probe.table, hide_index=True, width="stretch")


def page() -> None:
    """The Data page: the demo panel, the dataset picker, counts per hospital and sample tiles."""
    st.title("Data")
    st.caption("Each hospital's tiles, as `gastric-fl prepare` wrote them. Raw slides are never modified.")
    demo = _demo_job()
    demo_state = jobs.state(jobs_dir, demo) if demo else None
    refresh = 2.0 if demo_state is not None and demo_state.active else None
    ui.fragment("Data", demo_panel, refresh)(demo_state)

    dataset = ui.pick_dataset()
    if dataset is None:
        st.info(
            f"No prepared dataset under `{paths.prepared_root(root)}`. Press **Generate demo data** above, or prepare "
            "your own slides from a terminal:",
            icon=":material/info:",
        )
        st.code(ui.quickstart_commands(root).split("\n", 2)[1], language="bash")
        return

    try:
        manifest = load_manifest(dataset.path)
        record = load_prepare_json(dataset.path)
    except DashboardError as exc:
        st.error(str(exc))
        return

    classes = dataset_classes(dataset.path)
    table = counts_table(manifest, dataset.path, classes)
    hospitals = sorted(int(c) for c in manifest["client"].unique())
    cols = st.columns(5)
    cols[0].metric("Hospitals", len(hospitals))
    cols[1].metric("Tiles", f"{len(manifest):,}")
    cols[2].metric("Train tiles", f"{int((manifest['split'] == 'train').sum()):,}")
    cols[3].metric("Validation tiles", f"{int((manifest['split'] == 'val').sum()):,}")
    cols[4].metric("Test tiles", f"{int((manifest['split'] == 'test').sum()):,}")

    st.subheader("Tiles per hospital")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "grayscale": st.column_config.CheckboxColumn("grayscale", help="every tile of this hospital has 1 channel"),
            "source px": st.column_config.TextColumn("tile (slide px)", help="tile side in the source slide"),
            "stored px": st.column_config.TextColumn("tile (stored px)", help="side of the PNG written"),
        },
    )
    gray = [h for h in hospitals if bool(table.loc[table["hospital"] == hospital_label(h), "grayscale"].iloc[0])]
    if gray:
        st.caption(f"Grayscale hospitals: {', '.join(hospital_label(h) for h in gray)} (their tiles have one channel).")

    probe_section(record)
    if record:
        with st.expander("prepare.json (how this dataset was made)"):
            st.json(record, expanded=1)

    st.subheader("Sample tiles")
    tabs = st.tabs([hospital_label(h) for h in hospitals])
    for tab, hospital in zip(tabs, hospitals, strict=True):
        with tab:
            # a few of each class: 4 of normal and abnormal, 1 of each of 10 classes
            sample = sample_tiles(manifest, hospital, per_label=max(1, 8 // len(classes)), classes=classes)
            grid = st.columns(8)
            for i, row in enumerate(sample.itertuples(index=False)):
                # The word in bold, no colour: a caption is drawn faded, and coloured text in it falls below 4.5:1.
                with grid[i % 8]:
                    ui.tile_image(
                        dataset.path / str(row.path),
                        caption=f"**{row.label}** · {row.split}",
                        alt=f"{hospital_label(hospital)} {row.split} tile from slide {row.source}, "
                        f"labelled {row.label}",
                    )


page()
