"""`federation.amp_groups`: the within-group share of AMP's weights against chance, on hand-made matrices and runs.

Every expected number is worked out by hand from the matrices below (FedSAF paper 001, Eq. 3-8 and 16: row i of
``xi`` is hospital i's mixture; ``P_i = sum_{j != i} xi_ij``; ``W_i`` the share of ``P_i`` on i's own group;
chance ``(n_g - 1) / (K - 1)``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_cli

from federation.amp_groups import (
    amp_groups_report,
    parse_groups,
    read_group_shares,
    run_groups,
    within_group_share,
)
from federation.errors import FederationError

# Six hospitals, groups A: 0, 1; B: 2, 3, 4; C: 5 (alone). Symmetric, as AMP's xi is; the diagonal is 1 - P_i.
XI6: list[list[float | None]] = [
    [0.80, 0.10, 0.02, 0.03, 0.01, 0.04],
    [0.10, 0.70, 0.05, 0.05, 0.05, 0.05],
    [0.02, 0.05, 0.70, 0.08, 0.12, 0.03],
    [0.03, 0.05, 0.08, 0.70, 0.06, 0.08],
    [0.01, 0.05, 0.12, 0.06, 0.75, 0.01],
    [0.04, 0.05, 0.03, 0.08, 0.01, 0.79],
]
GROUPS6 = ["A", "A", "B", "B", "B", "C"]


def test_within_group_share_by_hand() -> None:
    share = within_group_share(XI6, GROUPS6)
    # P: 0.20, 0.30, 0.30, 0.30, 0.25, 0.21. Own group: 0.10 (0: 1), 0.10 (1: 0), 0.08 + 0.12 (2: 3, 4),
    # 0.08 + 0.06 (3: 2, 4), 0.12 + 0.06 (4: 2, 3), nothing (5 is alone).
    assert share.peer == pytest.approx((0.20, 0.30, 0.30, 0.30, 0.25, 0.21))
    assert share.within == pytest.approx((1 / 2, 1 / 3, 2 / 3, 7 / 15, 18 / 25, 0.0))
    # chance: A (2 - 1) / 5, B (3 - 1) / 5, C 0 / 5
    assert share.chance == pytest.approx((0.2, 0.2, 0.4, 0.4, 0.4, 0.0))
    assert share.mean_within == pytest.approx(403 / 900)  # (1/2 + 1/3 + 2/3 + 7/15 + 18/25 + 0) / 6
    assert share.mean_chance == pytest.approx(4 / 15)  # 1.6 / 6
    assert share.mean_peer == pytest.approx(0.26)
    assert share.groups == tuple(GROUPS6)


def test_uniform_weights_give_exactly_chance() -> None:
    xi = [[0.8 if i == j else 0.05 for j in range(5)] for i in range(5)]
    share = within_group_share(xi, ["A", "A", "B", "B", "B"])
    assert share.within == pytest.approx((0.25, 0.25, 0.5, 0.5, 0.5))
    assert share.within == pytest.approx(share.chance)
    assert share.mean_within == pytest.approx(0.4)
    assert share.mean_chance == pytest.approx(0.4)


def test_null_entries_leave_the_hospital_out_but_a_null_diagonal_does_not() -> None:
    xi = [list(row) for row in XI6]
    xi[3][5] = xi[5][3] = None  # an inf or nan weight, as aggregation.jsonl writes it
    xi[0][0] = None  # the self-weight is not part of the share
    share = within_group_share(xi, GROUPS6)
    assert share.within[3] is None
    assert share.within[5] is None
    assert share.peer[3] is None
    assert share.within[0] == pytest.approx(0.5)
    # means over hospitals 0, 1, 2, 4 only, chance over the same ones
    assert share.mean_within == pytest.approx((1 / 2 + 1 / 3 + 2 / 3 + 18 / 25) / 4)
    assert share.mean_chance == pytest.approx((0.2 + 0.2 + 0.4 + 0.4) / 4)
    assert share.mean_peer == pytest.approx((0.20 + 0.30 + 0.30 + 0.25) / 4)


def test_no_peer_weight_and_a_single_hospital_have_no_share() -> None:
    local = within_group_share([[1.0, 0.0, 0.0], [0.0, 0.9, 0.1], [0.0, 0.1, 0.9]], ["A", "A", "B"])
    assert local.peer == pytest.approx((0.0, 0.1, 0.1))
    assert local.within[0] is None
    assert local.within[1:] == pytest.approx((0.0, 0.0))
    assert local.mean_chance == pytest.approx(0.25)  # chance of hospitals 1 (1/2) and 2 (0/2) only
    alone = within_group_share([[1.0]], ["A"])
    assert alone.within == (None,)
    assert alone.chance == (None,)
    assert alone.mean_within is None
    with pytest.raises(ValueError, match="square"):
        within_group_share([[1.0, 0.0]], ["A"])
    with pytest.raises(ValueError, match="one group per hospital"):
        within_group_share([[1.0, 0.0], [0.0, 1.0]], ["A"])


# Round 1: hospitals 0-3 (4 missing), groups A, A, B, B; chance 1/3 each.
XI4 = [
    [0.88, 0.09, 0.01, 0.02],
    [0.09, 0.82, 0.03, 0.06],
    [0.01, 0.03, 0.80, 0.16],
    [0.02, 0.06, 0.16, 0.76],
]
XI5_UNIFORM = [[0.8 if i == j else 0.05 for j in range(5)] for i in range(5)]
GROUPS5 = {0: "A", 1: "A", 2: "B", 3: "B", 4: "B"}


def _aggregation(path: Path) -> Path:
    lines = [
        json.dumps({"round": 1, "seconds": 1.0, "clients": [0, 1, 2, 3], "xi": XI4, "off_diagonal_mass": 0.185}),
        '{"round": 2, "xi": [[',  # damaged in the middle of the file
        json.dumps({"round": 2, "clients": [0, 1, 2, 3, 4], "xi": XI5_UNIFORM}),
        json.dumps({"round": 3, "clients": [0, 1, 2, 3], "xi": [[1.0, 0.0], [0.0, 1.0]]}),  # not 4 x 4
        json.dumps({"round": 4, "seconds": 1.0}),  # a line without AMP weights
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reader_gives_each_round_with_its_missing_hospitals_and_names_what_it_left_out(tmp_path: Path) -> None:
    path = _aggregation(tmp_path / "aggregation.jsonl")
    shares = read_group_shares(path, GROUPS5)
    assert [r.round for r in shares.rounds] == [1, 2]
    first, second = shares.rounds
    assert first.hospitals == (0, 1, 2, 3)
    assert first.missing == (4,)
    # P: 0.12, 0.18, 0.20, 0.24; own group 0.09, 0.09, 0.16, 0.16 -> 3/4, 1/2, 4/5, 2/3
    assert first.share.within == pytest.approx((3 / 4, 1 / 2, 4 / 5, 2 / 3))
    assert first.share.mean_within == pytest.approx(163 / 240)
    assert first.share.mean_chance == pytest.approx(1 / 3)
    assert first.share.mean_peer == pytest.approx(0.185)
    assert second.missing == ()
    assert second.share.mean_within == pytest.approx(0.4)  # uniform: chance, (1/4 x 2 + 1/2 x 3) / 5
    assert second.share.mean_chance == pytest.approx(0.4)
    assert len(shares.problems) == 2
    assert f"{path}, line 2: not valid JSON" in shares.problems[0]
    assert f"{path}, line 4: xi is not a 4 x 4 matrix" in shares.problems[1]


def test_reader_refuses_a_hospital_without_group_and_a_run_without_amp(tmp_path: Path) -> None:
    path = _aggregation(tmp_path / "aggregation.jsonl")
    with pytest.raises(FederationError, match=r"line 1: hospital\(s\) 3 have no group"):
        read_group_shares(path, {0: "A", 1: "A", 2: "B"})
    plain = tmp_path / "fedavg.jsonl"
    plain.write_text(json.dumps({"round": 1, "seconds": 1.0}) + "\n", encoding="utf-8")
    with pytest.raises(FederationError, match="holds no AMP weights"):
        read_group_shares(plain, GROUPS5)


def test_a_round_written_twice_counts_once_the_last_time(tmp_path: Path) -> None:
    path = tmp_path / "aggregation.jsonl"
    path.write_text(
        json.dumps({"round": 1, "clients": [0, 1, 2, 3], "xi": XI4})
        + "\n"
        + json.dumps({"round": 1, "clients": [0, 1, 2, 3, 4], "xi": XI5_UNIFORM})
        + "\n",
        encoding="utf-8",
    )
    shares = read_group_shares(path, GROUPS5)
    assert [r.hospitals for r in shares.rounds] == [(0, 1, 2, 3, 4)]
    assert shares.problems == (f"{path}, line 2: round 1 appears again; this later record replaces the earlier one",)


def test_parse_groups() -> None:
    assert parse_groups("0, 0,1,x") == {0: "0", 1: "0", 2: "1", 3: "x"}
    with pytest.raises(FederationError, match="one group per hospital"):
        parse_groups("0,,1")


def _run(tmp_path: Path, groups: list[str | None]) -> Path:
    """A run directory trained on a dataset whose prepare.json records ``groups``; aggregation as `_aggregation`."""
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    clients = [{"client": c, "group": g} for c, g in enumerate(groups)]
    (dataset / "prepare.json").write_text(json.dumps({"clients": clients}), encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f'[data]\npath = "{dataset.as_posix()}"\n', encoding="utf-8")
    _aggregation(run / "aggregation.jsonl")
    return run


def test_groups_come_from_the_runs_dataset_and_the_report_is_written(tmp_path: Path) -> None:
    run = _run(tmp_path, ["A", "A", "B", "B", "B"])
    assert run_groups(run) == GROUPS5
    report = amp_groups_report(run)
    assert report.path == run / "amp_groups.md"
    text = report.path.read_text(encoding="utf-8")
    assert "Groups (prepare.json of" in text
    assert "A: 0, 1; B: 2, 3, 4" in text
    assert "| 1 | 4 | 0.185 | 0.679 | 0.333 | 4 |" in text
    assert "| 2 | 5 | 0.200 | 0.400 | 0.400 | - |" in text
    assert "| 4 | B | 0.200 | 0.500 | 0.500 |" in text  # the last round, per hospital
    assert "line 2: not valid JSON" in text
    # given groups replace the dataset's: all in one group, so every share and chance is 1
    given = amp_groups_report(run, parse_groups("g,g,g,g,g"), tmp_path / "elsewhere")
    assert given.path == tmp_path / "elsewhere" / "amp_groups.md"
    assert given.source == "given with --groups"
    assert given.shares.rounds[0].share.mean_within == pytest.approx(1.0)


def test_a_dataset_without_groups_asks_for_them(tmp_path: Path) -> None:
    run = _run(tmp_path, ["A", None, "B", "B", "B"])
    with pytest.raises(FederationError, match=r"records no group for hospital 1 .*--groups"):
        run_groups(run)


def test_report_command_prints_the_table_and_writes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path, [None] * 5)
    assert run_cli(monkeypatch, "report", str(run), "--groups", "A,A,B,B,B") == 0
    captured = capsys.readouterr()
    assert "| 1 | 4 | 0.185 | 0.679 | 0.333 | 4 |" in captured.out
    assert "warning:" in captured.err
    assert (run / "amp_groups.md").is_file()
    assert run_cli(monkeypatch, "report", str(run), "--amp-groups") == 2
    assert "records no group for hospital 0" in capsys.readouterr().err
    assert run_cli(monkeypatch, "report", str(run), "--amp-groups", "--html") == 2
