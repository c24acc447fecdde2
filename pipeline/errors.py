"""Errors the pipeline raises for bad input: one clear line naming the file or value and what to do."""


class PipelineError(ValueError):
    """Bad raw data or bad settings for ``synth``/``prepare``; the CLI prints it as one line and exits 2."""

    user_facing = True
