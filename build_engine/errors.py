"""Errors the build stage raises for problems a user can fix (the CLI prints them without a traceback)."""


class BuildError(Exception):
    """A checkpoint or build option Atlas cannot turn into an engine; the message says what to do."""


class CheckpointError(BuildError):
    """A checkpoint that is missing, truncated, corrupt or incomplete."""


class UnsupportedModelError(BuildError):
    """A model family or feature (MoE, unknown architecture) Atlas does not support yet."""
