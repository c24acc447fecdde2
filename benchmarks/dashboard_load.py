"""Page-load times of the dashboard in a real browser: time to first content and time until settled, per page.

Each measurement starts ``gastric-fl dashboard`` afresh (its own process group, a free port on 127.0.0.1, the
quick-start run in its data root) and opens one page directly in headless Chromium (Debian's, through Playwright;
``app.dashboard.browser``), so that the page pays for everything its first visit imports (**cold**); then it
reloads the same page on the same server (**warm**: modules imported, only the page's own work). Timed in the
browser from the start of the navigation (``performance.now()``):

- **first content**: the first heading or markdown text of the page's main area is visible;
- **settled**: Streamlit's "Running..." status widget is gone and stays gone for 1 s (the time it went away is
  reported, not the end of that second).

``--before DIR`` measures a second checkout (e.g. ``git worktree add --detach /tmp/before <commit>``) in the same
run, page by page and interleaved with this one, so that both see the same machine load. Without ``--data``, the
quick-start data (``scripts/quickstart.sh``: 60 synthetic slides, 3 hospitals, a 4-round FedSAF run) is made in a
temporary folder first. It prints a table and writes it, with the command and the machine state, to
benchmarks/results/dashboard_load.md.

    .venv/bin/python benchmarks/dashboard_load.py --before /tmp/before --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.dashboard import browser  # noqa: E402
from benchmarks._common import command_line, machine, write_result  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "dashboard_load.md"
# The dashboard lands on the Verdict page once a finished run exists (on the Data page before, and in checkouts
# older than the Verdict page), so every page is opened by its own path.
PAGES = {
    "Verdict": "verdict",
    "Data": "data",
    "Federation": "federation",
    "Hospital": "hospital",
    "Compare": "compare",
    "Slide": "slide",
}
QUIET_MS = 1000
TIMEOUT_MS = 180_000

# Runs in the page: resolves with the times (ms since navigation start) of the first visible heading or markdown
# of the main area, and of the moment the status widget went away for good (absent for QUIET_MS after it).
TIMING_JS = """
([quietMs, timeoutMs]) => new Promise((resolve, reject) => {
  let first = null, quietSince = null;
  const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const tick = () => {
    const now = performance.now();
    if (first === null) {
      const found = document.querySelectorAll(
        "[data-testid='stMain'] h1, [data-testid='stMain'] [data-testid='stMarkdown']");
      if ([...found].some(visible)) first = now;
    }
    const running = document.querySelector("[data-testid='stStatusWidget']") !== null;
    if (running || first === null) quietSince = null;
    else if (quietSince === null) quietSince = now;
    if (first !== null && quietSince !== null && now - quietSince >= quietMs) {
      resolve({first: first, settled: Math.max(first, quietSince)});
      return;
    }
    if (now > timeoutMs) { reject(new Error("the page did not settle")); return; }
    setTimeout(tick, 25);
  };
  tick();
})
"""


@dataclass(frozen=True)
class Checkout:
    """A source tree to serve the dashboard from, and its commit."""

    name: str
    path: Path
    commit: str

    def has_page(self, page: str) -> bool:
        """Whether this checkout has the page (the Slide and Verdict pages are newer than some)."""
        return (self.path / "app" / "dashboard" / "views" / f"{PAGES[page]}.py").is_file()


def checkout(name: str, path: Path) -> Checkout:
    """A checkout with its short commit id (``+ changes`` when its tree differs from the commit)."""
    commit = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout
    return Checkout(name, path, commit + (" + uncommitted changes" if dirty.strip() else ""))


@contextlib.contextmanager
def serve(tree: Checkout, data: Path, log: Path) -> Iterator[str]:
    """``gastric-fl dashboard`` of ``tree`` (its own sources first on the path) on a free loopback port."""
    port = browser.free_port()
    env = {**os.environ, "PYTHONPATH": str(tree.path)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "dashboard", "--port", str(port), "--data", str(data)],
            cwd=tree.path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        browser.wait_until_up(url, process)
        yield url
    finally:
        browser.stop(process)


def timings(page: Any) -> tuple[float, float]:
    """(first content, settled) in seconds since the navigation started."""
    result = page.evaluate(TIMING_JS, [QUIET_MS, TIMEOUT_MS])
    return result["first"] / 1000.0, result["settled"] / 1000.0


def measure(tree: Checkout, page_name: str, data: Path, tmp: Path) -> tuple[float, float, float, float]:
    """Cold (fresh server, first visit) and warm (reload) first-content and settled times of one page."""
    with serve(tree, data, tmp / f"{tree.name}-{PAGES[page_name] or 'data'}.log") as url, browser.chromium() as page:
        page.goto(f"{url}/{PAGES[page_name]}", wait_until="commit")
        cold = timings(page)
        page.reload(wait_until="commit")
        warm = timings(page)
    return (*cold, *warm)


def quickstart_data(folder: Path) -> Path:
    """The quick-start data (scripts/quickstart.sh) under ``folder``; returns the data root."""
    gfl = [sys.executable, "-m", "app.cli"]
    data = folder / "data"
    raw, prepared, run = data / "raw" / "quickstart", data / "prepared" / "quickstart", data / "runs" / "quickstart"
    synth = ["synth", "--format", "seed", "--images", "60", "--seed", "0", "--difficulty", "0.3", "--out", str(raw)]
    prepare = ["prepare", "--format", "seed", "--input", str(raw), "--out", str(prepared), "--clients", "3"]
    prepare += ["--tile", "128", "--seed", "0", "--grayscale-clients", "2"]
    train = ["train", "--config", "configs/demo.toml", "--data", str(prepared), "--out", str(run), "-q"]
    steps = [[*gfl, *synth], [*gfl, *prepare], [*gfl, *train]]
    for step in steps:
        print("$", " ".join(step[2:]), flush=True)
        subprocess.run(step, cwd=ROOT, check=True)
    return data


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit to measure side by side")
    parser.add_argument("--data", type=Path, help="data root holding the quick-start run (default: make one)")
    parser.add_argument("--repeats", type=int, default=2, help="fresh servers per page and checkout (median)")
    parser.add_argument("--pages", nargs="*", default=list(PAGES), choices=list(PAGES), help="pages to open")
    args = parser.parse_args()
    trees = [checkout("after", ROOT)]
    if args.before:
        trees.insert(0, checkout("before", args.before.resolve()))
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gfl-load-") as tmp_name:
        tmp = Path(tmp_name)
        data = args.data.resolve() if args.data else quickstart_data(tmp)
        found: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
        for repeat in range(args.repeats):
            for page_name in args.pages:
                for tree in trees:  # interleaved, so that both checkouts see the same load
                    if not tree.has_page(page_name):
                        continue
                    result = measure(tree, page_name, data, tmp)
                    found.setdefault((tree.name, page_name), []).append(result)
                    print(
                        f"[{repeat + 1}/{args.repeats}] {page_name:10s} {tree.name:6s} cold: first content "
                        f"{result[0]:5.2f} s, settled {result[1]:5.2f} s; warm: {result[2]:5.2f} s, {result[3]:5.2f} s",
                        flush=True,
                    )
    names = [t.name for t in trees]
    columns = ("cold first content", "cold settled", "warm first content", "warm settled")
    # Each figure for every checkout side by side: before, after.
    lines = [
        "| page | " + " | ".join(f"{what}, {name} (s)" for what in columns for name in names) + " |",
        "|---" * (1 + len(columns) * len(names)) + "|",
    ]
    for page_name in args.pages:
        cells = [
            _fmt([r[index] for r in found.get((name, page_name), [])])
            for index in range(len(columns))
            for name in names
        ]
        lines.append(f"| {page_name} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    load_end = os.getloadavg()
    trees_text = "; ".join(f"**{t.name}**: `{t.path}` at {t.commit}" for t in trees)
    report = f"""# Dashboard: page-load times in a real browser

Reproduce (from the repository root; `--before` is a checkout of the earlier commit, e.g. made with
`git worktree add --detach /tmp/before <commit>`):

    {command_line("dashboard_load.py")}

{machine()}; load average at the start {load_start[0]:.1f} / {load_start[1]:.1f} / {load_start[2]:.1f}. The cores
were shared with other work while this ran, so the figures are upper bounds and the two checkouts are compared
page by page, interleaved. Headless Chromium ({browser.VIEWPORT["width"]}x{browser.VIEWPORT["height"]}), Python
{sys.version.split()[0]}; median of {args.repeats} fresh servers per page and checkout. Checkouts: {trees_text}.

Seconds from the start of the navigation. *Cold*: a fresh `gastric-fl dashboard` process, the page opened
directly (it pays for everything its first visit imports); *warm*: the same page reloaded. *First content*: the
first heading or text of the page's main area is visible; *settled*: Streamlit's "Running..." widget has gone and
stays gone for 1 s (Streamlit shows that widget once a run has lasted 0.5 s, so a page whose run ends sooner is
settled within 0.5 s of its first content). Data root: the quick-start data (60 synthetic slides, 3 hospitals, the
4-round FedSAF run of `configs/demo.toml`: what the script makes without `--data`); each page shows that run. A page
missing from a checkout is "—".

{table}
"""
    write_result(RESULTS, report)
    print(f"wrote {RESULTS} (load average at the end {load_end[0]:.1f})")


if __name__ == "__main__":
    main()
