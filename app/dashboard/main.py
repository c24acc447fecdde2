"""Entry script of the dashboard (``gastric-fl dashboard`` runs ``streamlit run`` on it).

Five pages on Streamlit's multipage API (``st.navigation``): Data, Federation, Hospital, Slide, Compare, each run
under ``ui.page_guard``. FedSAF paper
(Miao et al., 2025): the Federation page runs Algorithm 1; the Hospital and Compare pages show the figures of
Sec. 5 (per-client accuracy and AUC, averaged/std/best over rounds, values transmitted).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.dashboard import paths, ui

# Not "pages/": Streamlit would add its own menu of that folder next to st.navigation's.
PAGES = Path(__file__).parent / "views"

st.set_page_config(page_icon="🔬", layout="wide")

# Links may name a run or a dataset (``?run=<id>``, ``?dataset=<name>``): applied once, then the pickers rule.
for _param, _key in (("run", ui.RUN_KEY), ("dataset", ui.DATASET_KEY)):
    if _param in st.query_params and f"_query_{_param}" not in st.session_state:
        st.session_state[_key] = st.query_params[_param]
        st.session_state[f"_query_{_param}"] = True

# A clinician lands on the verdict once a finished run with predictions exists; before that, on the data.
verdict_first = ui.finished_run_exists()
navigation = st.navigation(
    [
        st.Page(str(PAGES / "verdict.py"), title="Verdict", icon=":material/gavel:", default=verdict_first),
        st.Page(str(PAGES / "data.py"), title="Data", icon=":material/dataset:", default=not verdict_first),
        st.Page(str(PAGES / "federation.py"), title="Federation", icon=":material/hub:"),
        st.Page(str(PAGES / "hospital.py"), title="Hospital", icon=":material/local_hospital:"),
        st.Page(str(PAGES / "slide.py"), title="Slide", icon=":material/biotech:"),
        st.Page(str(PAGES / "compare.py"), title="Compare", icon=":material/compare_arrows:"),
    ]
)

# Each page its own browser title (a tab or a bookmark says which page it is); set once the page is known.
st.set_page_config(page_title=f"{navigation.title} · gastric-fl")

with st.sidebar:
    st.markdown("### gastric-fl")
    st.caption(
        "Federated learning for gastric cancer histopathology: each hospital keeps its slides and its model's "
        "head; only the shared layers travel (FedSAF)."
    )
    st.caption(f"Data folder: `{paths.data_root()}`")

# The catch-all: whatever a page raises outside its own guards becomes one line, never a traceback (the pages'
# fragments are guarded where they are made, `ui.fragment`, since their reruns do not pass through here).
with ui.page_guard(navigation.title):
    navigation.run()
