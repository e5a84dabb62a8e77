"""Which per-request loops the fast path runs: compiled (numba), or the numpy code.

Both give the same integers (tests/simulator/test_compiled.py), so a run's records do not depend
on which ran; the choice is speed alone. The compiled loops save 20-40 us per request, but a
process pays about 0.3 s once to load them (numba's import and its first call, from the on-disk
cache), so by default (`SPECTUNE_KERNELS=auto`) a run takes them where they are loaded already
or where it has enough requests to pay for loading them (`AUTO_REQUESTS`); a sweep loads them
once before its workers start (spectune/evaluate.py), and its workers inherit them.
`SPECTUNE_KERNELS=numba` loads them for every run, `numpy` never. Without numba (a bare GPU
host, a Python numba does not support yet) every run takes the numpy code. Measurements:
docs/speed.md, "Compiled per-request loops".
"""

from __future__ import annotations

import gc
import os
from types import ModuleType

#: SPECTUNE_KERNELS
CHOICES = ("auto", "numba", "numpy")
#: `auto`: a run of at least this many requests loads the compiled loops (about 0.3 s, which
#: 20,000 requests' 20-40 us each repay, with a margin)
AUTO_REQUESTS = 20_000

_loaded: ModuleType | None = None  # simulator.compiled, once imported
_active: ModuleType | None = None  # what this process's runs take now


def compiled() -> ModuleType | None:
    """The compiled loops (simulator/compiled.py) where `prepare` chose them, else None: the
    callers then run their numpy code."""
    return _active


def choice() -> str:
    """SPECTUNE_KERNELS, checked."""
    value = os.environ.get("SPECTUNE_KERNELS", "auto")
    if value not in CHOICES:
        from simulator.errors import ConfigError
        raise ConfigError(f"SPECTUNE_KERNELS={value!r}: use one of {', '.join(CHOICES)}")
    return value


def prepare(requests: int) -> ModuleType | None:
    """Choose the loops for a run (or a sweep) of `requests` requests, loading the compiled
    ones where SPECTUNE_KERNELS says so; returns what runs take."""
    global _active
    mode = choice()
    if mode == "numpy":
        _active = None
    elif mode == "numba" or _loaded is not None or requests >= AUTO_REQUESTS:
        _active = _load()
    else:
        _active = None
    return _active


def _load() -> ModuleType | None:
    """simulator.compiled with its loops' first calls made (numba's one-time cost), or None
    where numba does not import. Freezes the garbage collector's current objects (below)."""
    global _loaded
    if _loaded is None:
        try:
            import numba  # noqa: F401
        except ImportError:
            return None
        from simulator import compiled as module
        module.warm()
        # numba leaves some 140,000 objects behind, and every full collection of the
        # garbage collector would walk them for the rest of the process: about 4% of a
        # run's time (measured on the oracle's step path). Collected once, then kept out of
        # the collector's walks (refcounting still frees them; a sweep's forked workers
        # share them untouched)
        gc.collect()
        gc.freeze()
        _loaded = module
    return _loaded
