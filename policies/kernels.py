"""Which loops the policies that have compiled ones run (policies/compiled.py: `auto`'s,
kld_variance's, heuristic's, gammatune's, adaedl's and the oracle's walks, and a planner's
alternatives as ks, `prefix_counts`).

The simulator chooses per run (simulator/kernels.py, SPECTUNE_KERNELS) and hands the compiled
module here where its runs take compiled loops; else this holds None and each policy runs its
numpy code. Both give the same floats, so a policy decides the same whichever ran.
"""

from __future__ import annotations

from types import ModuleType

_active: ModuleType | None = None


def compiled() -> ModuleType | None:
    """policies.compiled where the runs of this process take compiled loops, else None."""
    return _active


def use(loops: ModuleType | None) -> None:
    """Set what `compiled` returns (simulator.kernels.prepare, per run)."""
    global _active
    _active = loops
