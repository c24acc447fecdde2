"""Case mix (``partition = "abnormal:F0,F1,..."``) and hospital groups (``clients.group``) in `prepare`.

The shares below are computed by hand from `pipeline.partition`'s rule: abnormal slides shared in proportion to
``F_c r_c``, normal ones to ``(1 - F_c) r_c``, by largest remainder (ties to the lower client).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.cli import run_cli
from support.seed_slides import config_for, make_seed, read_manifest

from federation.hospital.data import _own_config
from pipeline.config import Partition, SplitConfig, build_config, load_toml, parse_partition
from pipeline.errors import PipelineError
from pipeline.partition import assign_hospitals
from pipeline.prepare import prepare_dataset

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _labels(normal: int, abnormal: int) -> list[str]:
    return ["normal"] * normal + ["abnormal"] * abnormal


def _mix(labels: list[str], owners: list[int], clients: int) -> list[tuple[int, int]]:
    """(normal, abnormal) slides per client."""
    return [
        (
            sum(1 for lab, o in zip(labels, owners, strict=True) if o == c and lab == "normal"),
            sum(1 for lab, o in zip(labels, owners, strict=True) if o == c and lab == "abnormal"),
        )
        for c in range(clients)
    ]


def test_partition_spec_of_a_case_mix() -> None:
    part = parse_partition("Abnormal:0.2,0.5,0.8")
    assert part == Partition(kind="abnormal", shares=(0.2, 0.5, 0.8))
    assert part.spec() == "abnormal:0.2,0.5,0.8"
    assert parse_partition(part.spec()) == part
    for bad in ("abnormal:", "abnormal:1.5", "abnormal:-0.1", "abnormal:x", "abnormal:nan", "abnormal:0.2,,0.8"):
        with pytest.raises(PipelineError, match="is not understood"):
            parse_partition(bad)


def test_case_mix_is_exact_when_the_dataset_share_is_the_mean_share() -> None:
    # 15 abnormal over weights 0.2, 0.5, 0.8 (sum 1.5): 2, 5, 8; 15 normal over 0.8, 0.5, 0.2: 8, 5, 2.
    labels = _labels(15, 15)
    config = SplitConfig(clients=3, sizes="equal", partition=parse_partition("abnormal:0.2,0.5,0.8"))
    owners, ratios = assign_hospitals(labels, config, np.random.default_rng(0))
    assert ratios == [1.0, 1.0, 1.0]
    assert _mix(labels, owners, 3) == [(8, 2), (5, 5), (2, 8)]


def test_case_mix_on_another_dataset_share_keeps_the_order_and_the_extremes() -> None:
    # 6 abnormal over F r = 0.5, 0.5, 1.0 (sum 2): 1.5, 1.5, 3 -> floors 1, 1, 3, the spare one to client 0 (tie):
    # 2, 1, 3. 14 normal over (1 - F) r = 1.5, 0.5, 0 (sum 2): 10.5, 3.5, 0 -> 10, 3, 0 and the spare to client 0:
    # 11, 3, 0. Shares 2/13, 1/4, 1: below, at and above the others' order; F = 1 gets no normal slide.
    labels = _labels(14, 6)
    config = SplitConfig(clients=3, sizes="2,1,1", partition=parse_partition("abnormal:0.25,0.5,1"))
    owners, _ = assign_hospitals(labels, config, np.random.default_rng(3))
    assert _mix(labels, owners, 3) == [(11, 2), (3, 1), (0, 3)]
    # the same seed, the same slides; another seed, the same counts but other slides
    assert assign_hospitals(labels, config, np.random.default_rng(3))[0] == owners
    other, _ = assign_hospitals(labels, config, np.random.default_rng(4))
    assert _mix(labels, other, 3) == [(11, 2), (3, 1), (0, 3)]
    assert other != owners


def test_case_mix_refuses_what_it_cannot_share_out() -> None:
    nobody = SplitConfig(clients=2, sizes="equal", partition=parse_partition("abnormal:0,0"))
    with pytest.raises(PipelineError, match=r"leaves no client to hold the 3 abnormal slide\(s\).*above 0"):
        assign_hospitals(_labels(5, 3), nobody, np.random.default_rng(0))
    # one abnormal slide is all client 2 gets: fewer than the 2 every hospital needs
    short = SplitConfig(clients=3, sizes="equal", partition=parse_partition("abnormal:0,0,1"))
    with pytest.raises(PipelineError, match=r"leaves client\(s\) 2 with fewer than 2 slides"):
        assign_hospitals(_labels(10, 1), short, np.random.default_rng(0))
    with pytest.raises(PipelineError, match="needs the binary task's classes normal, abnormal"):
        assign_hospitals(
            ["a", "b", "a", "b"],
            SplitConfig(clients=2, sizes="equal", partition=parse_partition("abnormal:0.5,0.5")),
            np.random.default_rng(0),
            classes=("a", "b"),
        )


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"split": {"clients": 3, "partition": "abnormal:0.2,0.8"}}, "gives 2 abnormal share.* there are 3 clients"),
        (
            {
                "source": {"format": "class-folders", "classes": ["0", "1", "2"]},
                "split": {"clients": 1, "partition": "abnormal:0.5"},
            },
            "needs the binary task's classes normal, abnormal",
        ),
        ({"split": {"clients": 3}, "clients": {"group": ["A", "B"]}}, "--client-group has 2 names but there are 3"),
        ({"split": {"clients": 2}, "clients": {"group": ["A", "B c"]}}, "'B c' is not a usable group name"),
        ({"split": {"clients": 2}, "clients": {"group": [1, 2]}}, "clients.group must be a list of group names"),
    ],
)
def test_bad_case_mix_and_groups_are_refused(layer: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        build_config(layer, None, origin="preset.toml")


def test_groups_from_the_command_line_spelling() -> None:
    config = build_config({"split": {"clients": 3}}, {"clients": {"group": "north, north,south"}})
    assert config.clients.group == ("north", "north", "south")
    assert config.to_json()["clients"]["group"] == ["north", "north", "south"]


def test_the_clustered_preset_has_three_groups_sharing_profile_and_mix() -> None:
    config = build_config(load_toml(CONFIGS / "prepare_clustered.toml"))
    groups = config.clients.group
    assert groups == ("A",) * 3 + ("B",) * 3 + ("C",) * 3
    shares = config.split.partition.shares
    profiles = {p.hospital: dict(p.values) for p in config.sites.profile}
    for name in ("A", "B", "C"):
        members = [c for c, g in enumerate(groups) if g == name]
        assert len({shares[c] for c in members}) == 1
        assert len({tuple(sorted(profiles.get(c, {}).items())) for c in members}) == 1
    # the groups differ in both: mix and profile
    assert [shares[0], shares[3], shares[6]] == [0.2, 0.5, 0.8]
    assert 0 not in profiles
    assert profiles[3] != profiles[6]


def test_prepare_records_groups_and_gives_each_hospital_its_case_mix(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    truth = make_seed(raw, n=12)  # 6 normal, 6 abnormal
    # abnormal weights 0, 0.5, 1 (sum 1.5) share 6 slides as 0, 2, 4; normal weights 1, 0.5, 0 as 4, 2, 0
    config = config_for(
        raw,
        out,
        split={"clients": 3, "partition": "abnormal:0,0.5,1"},
        clients={"group": ["screening", "referral", "referral"]},
    )
    prepare_dataset(config)
    record = json.loads((out / "prepare.json").read_text(encoding="utf-8"))
    assert [c["group"] for c in record["clients"]] == ["screening", "referral", "referral"]
    assert record["config"]["clients"]["group"] == ["screening", "referral", "referral"]
    assert record["config"]["split"]["partition"] == "abnormal:0,0.5,1"
    by_client = [sorted(truth[s["source"]] for s in record["slides"] if s["client"] == c) for c in range(3)]
    assert by_client == [["normal"] * 4, ["abnormal", "abnormal", "normal", "normal"], ["abnormal"] * 4]
    assert {(r["client"], r["label"]) for r in read_manifest(out)} == {
        ("0", "normal"),
        ("1", "normal"),
        ("1", "abnormal"),
        ("2", "abnormal"),
    }
    assert "| groups (clients.group) | screening: 0; referral: 1, 2 |" in (out / "report.md").read_text()

    # A hospital's own extracted record keeps only its own group and its own share of abnormal slides.
    own = _own_config(record["config"], 2)
    assert own["clients"]["group"] == ["referral"]
    assert own["split"]["partition"] == "abnormal:1"
    assert own["split"]["clients"] == 3


def test_prepare_without_groups_records_none(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    make_seed(raw, n=8)
    prepare_dataset(config_for(raw, out))
    record = json.loads((out / "prepare.json").read_text(encoding="utf-8"))
    assert [c["group"] for c in record["clients"]] == [None, None]
    assert record["config"]["clients"]["group"] == []
    assert "groups (clients.group)" not in (out / "report.md").read_text()
    assert _own_config(record["config"], 1)["clients"]["group"] == []


def test_command_line_case_mix_and_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    truth = make_seed(raw, n=8)  # 4 normal, 4 abnormal
    args = ["prepare", "--input", str(raw), "--out", str(out), "--clients", "2", "--sizes", "equal", "--tile", "32"]
    code = run_cli(
        monkeypatch, *args, "--partition", "abnormal:0,1", "--client-group", "clinic,centre", "--no-progress"
    )
    assert code == 0
    record = json.loads((out / "prepare.json").read_text(encoding="utf-8"))
    assert [c["group"] for c in record["clients"]] == ["clinic", "centre"]
    assert {(s["client"], truth[s["source"]]) for s in record["slides"]} == {(0, "normal"), (1, "abnormal")}
