"""``scripts/multisite_lab.sh``: the deployment as separate sites on one machine (a network namespace and a Unix
user per site, homes 0700, no route out), a 2-round federation with the per-round metrics of the in-process
engine, and nothing of the lab left afterwards (processes, namespaces, users, folders). Needs root (it makes
namespaces and users)."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO
from support.runs import stable
from support.tiny_dataset import TINY_SETTINGS, make_dataset

SCRIPT = REPO / "scripts" / "multisite_lab.sh"
pytestmark = pytest.mark.slow


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False).returncode == 0


def _lab_namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith("gfl-lab-")]


@pytest.mark.skipif(not _can_make_namespaces(), reason="the lab makes network namespaces and users: root only")
def test_separate_sites_give_the_in_process_metrics_and_leave_nothing(tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "tiny")
    out = tmp_path / "lab"
    labs = set(Path("/tmp").glob("gfl-lab-*"))  # the lab's own folder is made in /tmp, where every site can pass
    settings = [x for s in TINY_SETTINGS if not s.startswith("run.rounds") for x in ("--set", s)]
    before = {p.pw_name for p in pwd.getpwall()}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--data", str(dataset), "--rounds", "2", "--out", str(out), *settings],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = (out / "lab.txt").read_text().splitlines()
    assert checks[0].startswith("lab: 3 hospitals and a server, 2 rounds")
    assert not [c for c in checks[1:-1] if not c.startswith("ok: ")]
    for expected in (
        "ok: deployed per-round metrics identical to in-process",
        "ok: h0's user cannot list h1's home",
        "ok: h0 has no route out of the lab",
        "ok: h0 cannot reach the SuperLink's control port",
        "ok: h2's outbound log is intact",
        # each site reads its own files and no other's (the refusals mean something: the own reads succeed)
        "ok: h0's user reads its own tiles",
        "ok: h0's user cannot read h1's tiles",
        "ok: h0's user cannot read the lab's dataset (every hospital's tiles)",
        "ok: h0's user cannot read the in-process reference's metrics",
        "ok: h0's user cannot read h1's console log",
    ):
        assert expected in checks
    deployed, reference = stable(out / "deployed"), stable(out / "in-process")
    assert deployed == reference
    assert sorted({(m["round"], m["client"]) for m in deployed}) == [(r, c) for r in (1, 2) for c in range(3)]
    # every hospital's audit against the server's anchor: replies of the run, nothing refused, the log intact
    for c in range(3):
        audit = (out / "logs" / f"audit-h{c}.txt").read_text()
        assert "integrity: intact (every line chained to the one before; the log holds its anchor)" in audit
        assert f"anchor: the anchor of run lab, hospital {c} (" in audit
        assert "refused requests: 0" in audit
    # nothing of the lab is left: no namespace, no user, no folder, no process of its users
    assert not _lab_namespaces()
    assert {p.pw_name for p in pwd.getpwall()} - before == set()
    assert set(Path("/tmp").glob("gfl-lab-*")) == labs
