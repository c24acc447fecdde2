"""Errors the dashboard raises for missing or malformed data; shown on the page as one line."""


class DashboardError(ValueError):
    """A dataset or run folder that does not follow data/README.md, or settings that cannot run."""

    user_facing = True
