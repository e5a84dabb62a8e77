"""Drafters: what proposes the tokens the target verifies, one module per drafter.

`base.Drafter` is the interface the live engine, the recorder and the profiler use; each drafter
module registers the names it builds (`registry.register`), and importing this package imports
them all, so adding a drafter is adding one module. torch-only.
"""

from drafters import eagle, early_exit, model, ngram, quantised  # noqa: F401  (they register)
from drafters.base import DraftChain, Drafter, StopRule
from drafters.registry import drafter_kinds, make_drafter

__all__ = ["DraftChain", "Drafter", "StopRule", "drafter_kinds", "make_drafter"]
