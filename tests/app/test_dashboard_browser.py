"""End to end in a real headless Chromium (Debian's, via Playwright): `gastric-fl dashboard` on a free loopback
port, a one-round federation started from the Federation page, until each hospital's AUC chart is drawn."""

from __future__ import annotations

from pathlib import Path

import pytest
from dashboard_fixtures import write_prepared

from app.dashboard import browser, jobs, paths

pytestmark = pytest.mark.browser


@pytest.mark.timeout(420)
def test_start_a_federation_from_the_browser(tmp_path: Path) -> None:
    if not browser.CHROMIUM.is_file():
        pytest.fail(f"{browser.CHROMIUM} is missing: run scripts/install_browser.sh (apt-get install chromium)")
    root = tmp_path / "data"
    write_prepared(root / "prepared" / "tiny")
    try:
        with browser.dashboard(root, tmp_path / "dashboard.log") as url, browser.chromium() as page:
            assert url.startswith("http://127.0.0.1:")
            page.goto(f"{url}/federation")
            browser.wait_idle(page)
            rounds = page.get_by_label("Rounds")
            rounds.fill("1")
            rounds.press("Tab")
            browser.wait_idle(page)
            page.get_by_role("button", name="Start federation").click()
            # The chart appears once the run's first round is in metrics.jsonl (the page refreshes itself).
            page.get_by_text("Test AUC per hospital").first.wait_for(timeout=300_000)
            browser.wait_idle(page)
            shot = tmp_path / "federation.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
            started = jobs.list_jobs(paths.jobs_root(root), kind="train")
            assert len(started) == 1
            assert (Path(started[0].target) / "metrics.jsonl").is_file()
    finally:
        for job in jobs.list_jobs(paths.jobs_root(root)):
            if jobs.state(paths.jobs_root(root), job).active:
                jobs.stop(paths.jobs_root(root), job)
