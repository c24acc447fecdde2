"""Whether AMP's attention concentrates within groups of similar hospitals (FedSAF paper 001, Sec. 3, Eq. 3-8, 16-18).

FedSAF's attentive message passing gives hospital ``i`` the mixture ``z_i = sum_j xi_ij rho_j`` with
``xi_ij = alpha_k A'(d_ij)`` for ``j != i`` (Eq. 3-8) and ``xi_ii = 1 - sum_{j != i} xi_ij`` (Eq. 16): the nearer
hospital ``j``'s shared model, the more weight it gets. The paper's motivation is that hospitals with similar data
find each other this way. Where the simulation knows which hospitals are alike (the *clustered* regime: groups of
hospitals sharing stain, scanner and case mix, docs/pipeline.md "Regimes"), that can be measured:

- hospital ``i``'s **peer weight** ``P_i = sum_{j != i} xi_ij`` (what `federation.strategies.amp.off_diagonal_mass`
  averages);
- its **within-group share** ``W_i = sum_{j != i, g(j) = g(i)} xi_ij / P_i``: the part of its peer weight that goes
  to hospitals of its own group;
- the **chance level** ``C_i = (n_{g(i)} - 1) / (K - 1)``: ``W_i`` if the peer weight were spread evenly over the
  other ``K - 1`` hospitals of the round (``n_g``: the hospitals of group ``g`` in the round).

A mean ``W`` above the mean ``C`` means AMP's weights concentrate within groups. ``W_i`` is undefined (``None``)
where ``P_i`` is not positive (no weight on others) or where a weight of row ``i`` is not a number (``aggregation.
jsonl`` writes inf and nan as null); means are taken over the hospitals whose ``W_i`` is defined, and the chance
level over the same hospitals, so the two compare like with like.

`within_group_share` computes one matrix's figures; `read_group_shares` reads them per round from a run's
``aggregation.jsonl`` (FedSAF and FedAMP log ``clients`` and ``xi`` each round: `federation.strategies.fedsaf`),
where a round covers only the hospitals that replied (the others are listed as missing and the chance level is that
of the hospitals present). The groups come from the dataset's ``prepare.json`` (``clients[].group``, written from the
prepare setting ``clients.group``: `run_groups`), the operator's record of the simulation that never reaches a
hospital, or are given (`parse_groups`). `write_markdown` writes ``amp_groups.md``, which ``gastric-fl report
--amp-groups`` prints and writes. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.jsonl import scan_jsonl
from federation.run_reader import read_config
from federation.runfiles import AGGREGATION_FILE, AMP_GROUPS_MD, CONFIG_FILE
from federation.runs import atomic_write_text
from infra.formats import PREPARE_RECORD
from infra.records import RecordError, read_prepare_record


@dataclass(frozen=True)
class GroupShare:
    """One AMP matrix's figures (module docstring), per hospital in the matrix's row order, and their means.

    ``peer[i]``: ``P_i``; ``within[i]``: ``W_i`` (``None``: undefined); ``chance[i]``: ``C_i`` (``None`` with a single
    hospital); ``mean_within`` and ``mean_chance``: means over the hospitals whose ``W_i`` is defined (``None`` when
    none is); ``mean_peer``: the mean ``P_i`` over the hospitals whose row holds only numbers."""

    groups: tuple[str, ...]
    peer: tuple[float | None, ...]
    within: tuple[float | None, ...]
    chance: tuple[float | None, ...]
    mean_peer: float | None
    mean_within: float | None
    mean_chance: float | None


def _number(value: Any) -> float | None:
    """A finite matrix entry as a float; ``None`` for null, inf, nan or anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def within_group_share(xi: Sequence[Sequence[float | None]], groups: Sequence[str]) -> GroupShare:
    """The within-group share of each hospital's peer weight in AMP's ``xi`` (Eq. 3-8, 16), and the chance level.

    ``xi``: a K x K matrix, row ``i`` hospital ``i``'s mixture (``None`` for an entry that is not a number);
    ``groups``: the group of each row's hospital. ``ValueError`` when ``xi`` is not square or ``groups`` does not
    name one group per row.
    """
    k = len(xi)
    if any(len(row) != k for row in xi):
        raise ValueError(f"xi must be a square matrix; its rows have lengths {[len(row) for row in xi]}")
    if len(groups) != k:
        raise ValueError(f"{len(groups)} group(s) for a {k} x {k} matrix: give one group per hospital")
    sizes = {g: sum(1 for h in groups if h == g) for g in groups}
    peer: list[float | None] = []
    within: list[float | None] = []
    chance: list[float | None] = []
    for i, row in enumerate(xi):
        chance.append((sizes[groups[i]] - 1) / (k - 1) if k > 1 else None)
        others = {j: _number(row[j]) for j in range(k) if j != i}
        numbers = {j: v for j, v in others.items() if v is not None}
        if k < 2 or len(numbers) < len(others):
            peer.append(None)
            within.append(None)
            continue
        total = math.fsum(numbers.values())
        own = math.fsum(v for j, v in numbers.items() if groups[j] == groups[i])
        peer.append(total)
        within.append(own / total if total > 0.0 else None)
    defined = [i for i in range(k) if within[i] is not None]
    return GroupShare(
        groups=tuple(groups),
        peer=tuple(peer),
        within=tuple(within),
        chance=tuple(chance),
        mean_peer=_mean([p for p in peer if p is not None]),
        mean_within=_mean([w for w in within if w is not None]),
        mean_chance=_mean([c for i in defined if (c := chance[i]) is not None]),
    )


@dataclass(frozen=True)
class RoundShare:
    """One round of ``aggregation.jsonl``: the hospitals in its ``xi`` (row order), their figures, and the hospitals
    with a group that are not in it (``missing``: they did not reply, or were left out, that round)."""

    round: int
    hospitals: tuple[int, ...]
    share: GroupShare
    missing: tuple[int, ...]


@dataclass(frozen=True)
class GroupShares:
    """Every round's figures in round order, and one line per record left out (naming the file and line)."""

    rounds: tuple[RoundShare, ...]
    problems: tuple[str, ...]


def _matrix(value: Any, k: int) -> list[list[float | None]] | None:
    """``xi`` as logged, checked to be a k x k list of numbers and nulls; ``None`` when it is not."""
    if not isinstance(value, list) or len(value) != k:
        return None
    rows: list[list[float | None]] = []
    for row in value:
        if not isinstance(row, list) or len(row) != k:
            return None
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, int | float)) for v in row):
            return None
        rows.append([None if v is None else float(v) for v in row])
    return rows


def read_group_shares(path: Path, groups: Mapping[int, str]) -> GroupShares:
    """Each round's `within_group_share` from a run's ``aggregation.jsonl`` (``path``), ``groups`` mapping hospital
    index to group.

    A damaged line, a round whose ``xi`` is not a matrix over its ``clients``, and a round written twice (the last
    one counts, as in `federation.runfiles.read_metrics`) are named in ``problems``. A `FederationError` when the file
    holds no ``xi`` at all (not an AMP run: FedSAF or FedAMP log it) or a hospital of a round has no group.
    """
    scan = scan_jsonl(path)
    problems = [f"{bad}; the record is left out" for bad in scan.damaged]
    by_round: dict[int, RoundShare] = {}
    seen_xi = False
    for record, line in zip(scan.records, scan.lines, strict=True):
        where = f"{path}, line {line}"
        if "xi" not in record:
            continue
        seen_xi = True
        number = record.get("round")
        if isinstance(number, bool) or not isinstance(number, int):
            problems.append(f"{where}: round is {number!r}, not a whole number; the record is left out")
            continue
        hospitals = record.get("clients")
        size = len(record["xi"]) if isinstance(record["xi"], list) else 0
        if hospitals is None:
            hospitals = list(range(size))
        if not isinstance(hospitals, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in hospitals
        ):
            problems.append(f"{where}: clients is {hospitals!r}, not a list of hospital indices; the round is left out")
            continue
        xi = _matrix(record["xi"], len(hospitals))
        if xi is None:
            problems.append(
                f"{where}: xi is not a {len(hospitals)} x {len(hospitals)} matrix over clients {hospitals}; "
                "the round is left out"
            )
            continue
        unknown = [c for c in hospitals if c not in groups]
        if unknown:
            raise FederationError(
                f"{where}: hospital(s) {', '.join(map(str, unknown))} have no group; give one group per hospital "
                "(--groups, e.g. 0,0,0,1,1,1) or prepare the dataset with clients.group"
            )
        if number in by_round:
            problems.append(f"{where}: round {number} appears again; this later record replaces the earlier one")
        by_round[number] = RoundShare(
            round=number,
            hospitals=tuple(hospitals),
            share=within_group_share(xi, [groups[c] for c in hospitals]),
            missing=tuple(sorted(set(groups) - set(hospitals))),
        )
    if not seen_xi:
        raise FederationError(
            f"{path} holds no AMP weights (xi): only FedSAF and FedAMP runs log them; "
            "train with strategy.name = fedsaf or fedamp"
        )
    return GroupShares(tuple(by_round[r] for r in sorted(by_round)), tuple(problems))


def parse_groups(text: str) -> dict[int, str]:
    """``"A,A,B,B"`` -> ``{0: "A", 1: "A", 2: "B", 3: "B"}``: one group name per hospital, in hospital order."""
    names = [part.strip() for part in text.split(",")]
    if not names or any(not name for name in names):
        raise FederationError(
            f"--groups {text!r} must name one group per hospital, comma-separated in hospital order, e.g. 0,0,0,1,1,1"
        )
    return dict(enumerate(names))


def run_dataset(run_dir: Path) -> Path:
    """The prepared dataset a run was trained on: ``data.path`` of its ``config.toml`` (a relative path is taken
    from the current folder, as ``gastric-fl train`` took it)."""
    try:
        config = read_config(run_dir)
    except RecordError as exc:
        if exc.kind == "missing":
            raise FederationError(
                f"{run_dir} is not a run directory (no {CONFIG_FILE}): give a folder made by gastric-fl train"
            ) from None
        raise FederationError(f"{exc.path} cannot be read ({exc.cause})") from None
    path = (config.tables.get("data") or {}).get("path")
    if not isinstance(path, str) or not path:
        raise FederationError(f"{run_dir / CONFIG_FILE} names no data.path; give the groups with --groups")
    return Path(path)


def run_groups(run_dir: Path) -> dict[int, str]:
    """Each hospital's group, from ``clients[].group`` of the ``prepare.json`` of the dataset the run was trained on
    (`run_dataset`); a `FederationError` saying to give ``--groups`` when it cannot be read or records no group for
    some hospital."""
    dataset = run_dataset(run_dir)
    record_path = dataset / PREPARE_RECORD
    try:
        entries = read_prepare_record(dataset).hospitals
    except RecordError as exc:
        if exc.kind != "malformed":
            raise FederationError(
                f"the run's dataset record {record_path} cannot be read ({exc.cause}); give the groups with --groups"
            ) from None
        entries = None
    if not isinstance(entries, list) or not entries:
        raise FederationError(f"{record_path} lists no hospitals (clients); give the groups with --groups")
    groups: dict[int, str] = {}
    for entry in entries:
        hospital = entry.get("client") if isinstance(entry, dict) else None
        group = entry.get("group") if isinstance(entry, dict) else None
        if not isinstance(hospital, int) or not isinstance(group, str) or not group:
            raise FederationError(
                f"{record_path} records no group for hospital {hospital} (clients[].group, from the prepare setting "
                "clients.group); prepare the dataset with groups or give them with --groups, e.g. 0,0,0,1,1,1"
            )
        groups[hospital] = group
    return groups


def groups_text(groups: Mapping[int, str]) -> str:
    """``A: 0, 1, 2; B: 3, 4`` (groups in order of their first hospital)."""
    members: dict[str, list[int]] = {}
    for hospital in sorted(groups):
        members.setdefault(groups[hospital], []).append(hospital)
    return "; ".join(f"{name}: {', '.join(map(str, hospitals))}" for name, hospitals in members.items())


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


ROUND_COLUMNS = ("round", "hospitals", "peer weight", "within-group share", "chance", "missing")


def round_table(shares: GroupShares) -> str:
    """The per-round table (markdown): mean peer weight, mean within-group share and chance, missing hospitals."""
    lines = ["| " + " | ".join(ROUND_COLUMNS) + " |", "|" + "---:|" * (len(ROUND_COLUMNS) - 1) + "---|"]
    for r in shares.rounds:
        s = r.share
        missing = ", ".join(map(str, r.missing)) or "-"
        lines.append(
            f"| {r.round} | {len(r.hospitals)} | {_fmt(s.mean_peer)} | {_fmt(s.mean_within)} | {_fmt(s.mean_chance)} "
            f"| {missing} |"
        )
    return "\n".join(lines) + "\n"


def hospital_table(row: RoundShare) -> str:
    """One round's per-hospital table (markdown): group, peer weight, within-group share, chance."""
    lines = ["| hospital | group | peer weight | within-group share | chance |", "|---:|---|---:|---:|---:|"]
    s = row.share
    for i, hospital in enumerate(row.hospitals):
        lines.append(f"| {hospital} | {s.groups[i]} | {_fmt(s.peer[i])} | {_fmt(s.within[i])} | {_fmt(s.chance[i])} |")
    return "\n".join(lines) + "\n"


def markdown(run: str, shares: GroupShares, groups: Mapping[int, str], source: str) -> str:
    """``amp_groups.md``: what is measured, the groups and where they come from, the per-round table, the last
    round's per-hospital table and the records left out."""
    parts = [
        f"# AMP weights within groups: {run}",
        "",
        f"Groups ({source}): {groups_text(groups)}.",
        "",
        "For hospital i, the peer weight is sum_{j != i} xi_ij, the weight AMP gives the other hospitals' shared "
        "models in hospital i's mixture (FedSAF paper 001, Eq. 3-8 and 16-18); the within-group share is the part "
        "of it that goes to hospitals of i's own group; chance is that share if the peer weight were spread evenly "
        "over the other hospitals of the round, (n_g - 1) / (K - 1). Means over the hospitals whose share is "
        "defined. A within-group share above chance: AMP's weights concentrate within groups.",
        "",
        round_table(shares),
    ]
    if shares.rounds:
        last = shares.rounds[-1]
        parts += [f"Round {last.round}, per hospital:", "", hospital_table(last)]
    if shares.problems:
        parts += ["Left out:", "", *(f"- {p}" for p in shares.problems), ""]
    return "\n".join(parts)


@dataclass(frozen=True)
class AmpGroupsReport:
    """What `amp_groups_report` measured for one run and where it wrote ``amp_groups.md``."""

    shares: GroupShares
    groups: dict[int, str]
    source: str
    text: str
    path: Path


def amp_groups_report(
    run_dir: Path, groups: Mapping[int, str] | None = None, out: Path | None = None
) -> AmpGroupsReport:
    """Read ``run_dir``'s ``aggregation.jsonl`` with ``groups`` (default: `run_groups`) and write ``amp_groups.md``
    into ``out`` (default: the run directory)."""
    if not (run_dir / CONFIG_FILE).is_file():
        raise FederationError(
            f"{run_dir} is not a run directory (no {CONFIG_FILE}): give a folder made by gastric-fl train"
        )
    if groups is None:
        resolved, source = run_groups(run_dir), f"prepare.json of {run_dataset(run_dir)}"
    else:
        resolved, source = dict(groups), "given with --groups"
    shares = read_group_shares(run_dir / AGGREGATION_FILE, resolved)
    text = markdown(run_dir.name, shares, resolved, source)
    target = (out if out is not None else run_dir) / AMP_GROUPS_MD
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, text)
    return AmpGroupsReport(shares, resolved, source, text, target)
