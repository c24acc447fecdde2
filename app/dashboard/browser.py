"""Drive the dashboard in a real headless Chromium: the end-to-end test and the docs screenshots share this.

Debian's ``/usr/bin/chromium`` (installed by ``scripts/install_browser.sh``) is driven through Playwright; no
browser build is ever downloaded. The flags keep an offline Chromium from trying to reach the network.

Regenerate the screenshots in docs/img from a data root that holds a prepared dataset and runs::

    .venv/bin/python -m app.dashboard.browser --data data --out docs/img [--run RUN_ID]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from infra.pids import stop_groups

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}
PAGES = {
    "verdict": "",  # where the dashboard lands once a finished run exists
    "data": "data",
    "federation": "federation",
    "hospital": "hospital",
    "compare": "compare",
    "compare_grid": "compare?compare=grid",
}


def free_port() -> int:
    """A TCP port on the loopback interface nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_dashboard(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``gastric-fl dashboard --port PORT --data DATA`` in its own process group, output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "dashboard", "--port", str(port), "--data", str(data)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_until_up(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Poll Streamlit's health endpoint until it answers; raise if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the dashboard exited with code {process.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"the dashboard did not answer at {url} within {timeout_s:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the dashboard's process group (`infra.pids.stop_groups`: SIGTERM, SIGKILL if it lingers) and reap it."""
    stop_groups([process.pid], grace=10.0)
    process.wait(timeout=10)


@contextlib.contextmanager
def dashboard(data: Path, log: Path) -> Iterator[str]:
    """Run the dashboard on a free loopback port for the duration of the block; yields its URL."""
    port = free_port()
    process = start_dashboard(data, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        yield url
    finally:
        stop(process)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium context (new profile in a temporary folder); yields a Playwright page."""
    if not CHROMIUM.is_file():
        raise FileNotFoundError(f"{CHROMIUM} not found: run scripts/install_browser.sh (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="gfl-chromium-") as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=VIEWPORT,  # type: ignore[arg-type]
            device_scale_factor=1,
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            yield page
        finally:
            context.close()


def wait_idle(page: Any, timeout_ms: float = 60_000) -> None:
    """Wait until the page has a title and Streamlit has finished running its script (no "Stop" widget)."""
    page.wait_for_selector("[data-testid='stMain'] h1", timeout=timeout_ms)
    for _ in range(2):  # the status widget can blink off between two reruns: require two quiet checks
        page.wait_for_function(
            "() => !document.querySelector(\"[data-testid='stStatusWidget']\")", timeout=timeout_ms, polling=250
        )
        page.wait_for_timeout(700)  # also lets Plotly finish drawing


def screenshot_pages(url: str, out: Path, pages: dict[str, str] | None = None, run: str | None = None) -> list[Path]:
    """Open each page (showing ``run`` if given) and save ``dashboard_<page>.png`` (full page) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    saved = []
    with chromium() as page:
        for name, path in (pages or PAGES).items():
            query = f"{'&' if '?' in path else '?'}run={urllib.parse.quote(run)}" if run else ""
            page.goto(f"{url}/{path}{query}")
            wait_idle(page)
            # Streamlit scrolls inside its main section, so "full page" is the viewport: grow it to the content.
            height = page.evaluate("() => document.querySelector(\"[data-testid='stMain']\").scrollHeight")
            page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(height) + 40, 6000)})
            wait_idle(page)
            target = out / f"dashboard_{name}.png"
            page.screenshot(path=str(target))
            page.set_viewport_size(VIEWPORT)
            saved.append(target)
    return saved


def main(argv: list[str] | None = None) -> None:
    """Regenerate the docs screenshots from a data root."""
    parser = argparse.ArgumentParser(description="Screenshot every dashboard page in headless Chromium.")
    parser.add_argument("--data", type=Path, default=Path("data"), help="data root with prepared/ and runs/")
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="folder for dashboard_<page>.png")
    parser.add_argument("--run", help="run id the Federation and Hospital pages show (default: the newest)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, dashboard(args.data.resolve(), Path(tmp) / "dashboard.log") as url:
        for path in screenshot_pages(url, args.out, run=args.run):
            print(path)


if __name__ == "__main__":
    main()
