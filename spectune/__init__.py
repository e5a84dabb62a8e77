"""spectune: decide how far to speculate. The CLI and the user's jobs live here."""

__version__ = "0.1.0"
