"""`gastric-fl dashboard`: open the Streamlit dashboard (data, federation, hospital and comparison pages).

It runs ``streamlit run app/dashboard/main.py`` headless on 127.0.0.1 (loopback only unless ``--host`` says
otherwise), with usage statistics off, no file watcher and no error details in the browser (tracebacks go to the
terminal); the data root travels in ``GASTRIC_FL_DATA`` and the Slide page's pixel limit (``--max-pixels``) in
``GASTRIC_FL_MAX_PIXELS``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

MAIN_SCRIPT = Path(__file__).resolve().parent / "dashboard" / "main.py"


TEXT_COLOUR = "#111111"
CODE_COLOUR = "#000000"


def streamlit_command(host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line: headless, no telemetry, no file watcher, no error details in the
    browser, bound to ``host:port``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(MAIN_SCRIPT),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--browser.serverAddress",
        host,
        "--browser.serverPort",
        str(port),
        "--client.toolbarMode",
        "viewer",
        # An error that escapes a page's guard (app.dashboard.ui.page_guard) shows a generic line in the browser,
        # never a traceback; the details go to this terminal.
        "--client.showErrorDetails",
        "none",
        "--theme.primaryColor",
        "#0f766e",
        # Captions are the text colour faded to 60%: a near-black text colour keeps them at about 5:1 on white, and
        # inline code dark enough, so every page meets WCAG AA's 4.5:1 (axe-core,
        # tests/app/dashboard/test_dashboard_browser.py).
        "--theme.textColor",
        TEXT_COLOUR,
        "--theme.codeTextColor",
        CODE_COLOUR,
    ]


def register(app: typer.Typer) -> None:
    """Add the `dashboard` subcommand to `app`."""

    @app.command("dashboard")
    def dashboard(
        host: str = typer.Option("127.0.0.1", help="Address to listen on; keep 127.0.0.1 unless others must reach it."),
        port: int = typer.Option(8501, min=1, max=65535, help="TCP port to listen on."),
        data: Path = typer.Option(
            Path("data"), help="Data root holding raw/, prepared/ and runs/ (created on first use)."
        ),
        max_pixels: int | None = typer.Option(
            None,
            "--max-pixels",
            help="Slide page: refuse an uploaded or picked slide whose header declares more pixels than this "
            "(default 67108864 = 8192 x 8192; at most 1073741824).",
        ),
    ) -> None:
        """Open the dashboard: prepare demo data, start and watch a federation, read each hospital's results."""
        from app.errors import DashboardError
        from app.slide_view import MAX_PIXELS_ENV
        from pipeline.images import check_max_pixels

        if data.exists() and not data.is_dir():
            raise DashboardError(f"--data {data} is a file: pass the folder that holds prepared/ and runs/")
        env = {**os.environ, "GASTRIC_FL_DATA": str(data.expanduser().resolve())}
        if max_pixels is not None:
            env[MAX_PIXELS_ENV] = str(check_max_pixels(max_pixels))
        command = streamlit_command(host, port)
        typer.echo(f"gastric-fl dashboard on http://{host}:{port} (data: {env['GASTRIC_FL_DATA']}); Ctrl+C stops it")
        sys.stdout.flush()
        # exec: Streamlit becomes this process, so Ctrl+C and SIGTERM reach it directly.
        os.execve(sys.executable, command, env)
