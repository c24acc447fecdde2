"""SIGTERM/SIGHUP during a command that writes a dataset: the same cleanup as Ctrl-C, then one ``error:`` line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer


@contextmanager
def exit_when_terminated(command: str, target: Path) -> Iterator[None]:
    """Run the block with SIGTERM/SIGHUP unwinding it like Ctrl-C (`infra.outputs.terminate_as_interrupt`).

    A terminated block left nothing at ``target`` (its writers clean up on the way out): say so and exit with
    ``128 + signal number``, as a shell reports a process ended by that signal.
    """
    from infra.outputs import Terminated, terminate_as_interrupt

    try:
        with terminate_as_interrupt():
            yield
    except Terminated as stop:
        typer.secho(
            f"error: {command} stopped by {stop.name}; nothing was written to {target} (run it again)",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(128 + stop.signum) from None
