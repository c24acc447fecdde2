"""The ``gastric-fl`` command line: synth, prepare, train, ablate, report, predict, threshold, dashboard.

Each subcommand lives in its own module (``app/cmd_<name>.py``) exposing ``register(app)``; heavy imports
(torch, streamlit) happen inside the commands so that ``--help`` stays instant.
Errors meant for the user (``PipelineError``, ``FederationError``, ``ModelError``: all carry
``user_facing = True``) are printed as one line and exit with code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

import typer

import federation  # noqa: F401  (importing it turns off every library's update check and telemetry: OFFLINE_ENV)
from app import (
    cmd_ablate,
    cmd_dashboard,
    cmd_federation,
    cmd_predict,
    cmd_prepare,
    cmd_report,
    cmd_synth,
    cmd_threshold,
    cmd_train,
)

app = typer.Typer(
    name="gastric-fl",
    help=(
        "Federated learning for gastric cancer histopathology (FedSAF).\n\n"
        "Typical flow: synth (or bring real slides) -> prepare -> train / ablate -> report, "
        "or do it all from the dashboard."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_COMMANDS = (
    cmd_synth,
    cmd_prepare,
    cmd_train,
    cmd_ablate,
    cmd_report,
    cmd_predict,
    cmd_threshold,
    cmd_dashboard,
    cmd_federation,
)
for _module in _COMMANDS:
    _module.register(app)


def main() -> None:
    """Console-script entry point: run the CLI, turning user-facing errors into one line and exit code 2."""
    try:
        app()
    except Exception as exc:
        if getattr(exc, "user_facing", False):
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
