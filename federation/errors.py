"""Errors the federation raises for bad input or a broken run."""


class FederationError(ValueError):
    """Bad configuration, data or run state; the CLI prints it as one line and exits 2.

    ``key``: the configuration key the error is about (``"section.key"``, e.g. ``"strategy.nhead"``), or ``None``
    when it is about no single key; a form can then mark that field without reading the message.
    """

    user_facing = True

    def __init__(self, *args: object, key: str | None = None) -> None:
        super().__init__(*args)
        self.key = key


class Diverged(FederationError):
    """A training or evaluation became non-finite (NaN or inf): a ``Failure`` with ``diverged = True``, which the
    server answers with advice to lower the learning rate (a resumed run keeps it, so --resume cannot help)."""


class Interrupted(Exception):
    """The process was asked to stop (SIGTERM): never turned into one hospital's failure, always unwinds the run."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none): what a one-line report shows."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
