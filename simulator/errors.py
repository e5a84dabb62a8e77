"""The simulator's error type for bad configuration (unknown model, impossible capacity...)."""


class ConfigError(ValueError):
    """A user-facing configuration problem: one line saying what, where, and what to do."""
