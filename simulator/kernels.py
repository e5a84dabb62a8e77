"""Which per-request loops the fast path runs: compiled (numba), or the numpy code.

Both give the same integers and floats (tests/simulator/test_compiled.py), so a run's records do
not depend on which ran; the choice is speed alone. The compiled loops save 20-40 us per
request, but a process pays about 0.3 s once to load them (numba's import and its first call,
from the on-disk cache), so by default (`SPECTUNE_KERNELS=auto`) a run takes them where they
are loaded already or where it has enough requests to pay for loading them (`AUTO_REQUESTS`,
or fewer for a policy whose steps run in compiled loops, its `Policy.runs_repay_from`: `auto`'s,
in policies/compiled.py, handed to `policies.kernels` with these, and goodput's runs of steps,
simulator/compiled_walked.py; or a run that takes the whole run's loop, simulator/whole_run.py's
`REPAYS_FROM`); a
sweep whose first batch has that many loads them once before its workers fork
(spectune/evaluate.py), and its workers inherit them (a Ray sweep's workers choose run by run).
`SPECTUNE_KERNELS=numba` loads them for every run, `numpy` never. Without numba (a bare GPU
host, a Python numba does not support yet) every run takes the numpy code. Measurements:
docs/speed.md, "Compiled per-request loops".
"""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import warnings
from fractions import Fraction
from pathlib import Path
from types import ModuleType

#: SPECTUNE_KERNELS
CHOICES = ("auto", "numba", "numpy")
#: `auto`: a run of at least this many requests loads the compiled loops (about 0.3 s, which
#: 20,000 requests' 20-40 us each repay, with a margin)
AUTO_REQUESTS = 20_000
#: (or fewer where its policy's steps run in compiled loops: `Policy.runs_repay_from`, the
#: requests from which a run of it repays loading them)

#: the files the compiled loops are built from, and those whose constants they read. numba's
#: cache checks only the file of each function, not the functions it calls or the constants it
#: reads from others: after an edit of one of these, a loop calling into it would run its old
#: code from the cache. So the cache lives in a folder named by their hash (`_cache_dir`).
SOURCES = ("policies/compiled.py", "policies/goodput.py", "simulator/compiled.py",
           "simulator/compiled_goodput.py", "simulator/compiled_oracle.py",
           "simulator/compiled_serve.py",
           "simulator/compiled_steps.py", "simulator/compiled_walked.py",
           "simulator/run_records.py")

_loaded: ModuleType | None = None  # simulator.compiled, once imported
_policy_loops: ModuleType | None = None  # policies.compiled, loaded with it
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


def prepare(requests: int, repaid: float | Fraction = 0.0) -> ModuleType | None:
    """Choose the loops for a run (or a sweep) of `requests` requests, loading the compiled ones
    where SPECTUNE_KERNELS says so; `repaid`: how many times over the runs of policies whose
    steps run in compiled loops repay loading them (each run's requests over its policy's
    `runs_repay_from`, summed); returns what runs take."""
    global _active
    mode = choice()
    if mode == "numpy":
        _active = None
    elif (mode == "numba" or _loaded is not None or requests >= AUTO_REQUESTS
          or repaid >= 1.0):
        _active = _load(forced=mode == "numba")
    else:
        _active = None
    # the policies' loops with them (imported here, not above: a script in benchmarks/ that
    # only prices steps would find benchmarks/policies.py under that name)
    from policies import kernels as policy_kernels
    policy_kernels.use(_policy_loops if _active is not None else None)
    return _active


_failed: list[str] = []  # why the compiled loops could not load here, once found


def _load(forced: bool) -> ModuleType | None:
    """simulator.compiled with its loops' first calls made (numba's one-time cost), or None
    where numba does not import, or (said once) where numba cannot compile or load them here;
    `forced` (SPECTUNE_KERNELS=numba) makes that an error. Freezes the garbage collector's
    current objects (below)."""
    global _loaded, _policy_loops
    if _loaded is None:
        if _failed and not forced:
            return None
        try:
            import numba
        except ImportError:  # (remembered: a run of 300 auto requests would look again)
            if not _failed:
                _failed.append("numba is not installed")
            return None
        users = numba.config.CACHE_DIR  # (restored after: other libraries' caches are theirs)
        try:
            if not os.environ.get("NUMBA_CACHE_DIR"):  # (else the user's, as numba's own)
                numba.config.CACHE_DIR = _cache_dir()
            from policies import compiled as policy_loops
            from simulator import compiled as module
            from simulator import compiled_serve, compiled_steps, compiled_walked
            module.warm()
            policy_loops.warm()
            compiled_steps.warm()  # (auto's and kld_variance's runs of steps: stepped.py)
            compiled_walked.warm()  # (the walked policies' under vLLM's scheduler)
            compiled_serve.warm()  # (a whole run in one loop: whole_run.py)
        except Exception as error:  # numba installed but unusable here (its compiler, its
            # cache, this CPU): a speed-up only, so the numpy code runs, unless it was asked for
            why = f"{type(error).__name__}: {error}".splitlines()[0]
            if forced:
                from simulator.errors import ConfigError
                raise ConfigError(f"SPECTUNE_KERNELS=numba: the compiled loops could not load "
                                  f"({why}); run with SPECTUNE_KERNELS=numpy") from None
            if not _failed:
                _failed.append(why)
                warnings.warn(f"the compiled loops could not load ({why}); running their "
                              "numpy code (the same results, slower)", stacklevel=2)
            return None
        finally:  # (each loop keeps the cache it was made with)
            numba.config.CACHE_DIR = users
        # numba leaves some 140,000 objects behind, and every full collection of the
        # garbage collector would walk them for the rest of the process: about 4% of a
        # run's time (measured on the oracle's step path). Collected once, then kept out of
        # the collector's walks (refcounting still frees them; a sweep's forked workers
        # share them untouched)
        gc.collect()
        gc.freeze()
        _loaded, _policy_loops = module, policy_loops
    return _loaded


def sources_hash() -> str:
    """The hash of `SOURCES`' contents (16 hex digits)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((root / name).read_bytes())
    return digest.hexdigest()[:16]


def _cache_dir() -> str:
    """Where numba caches the compiled loops: a folder named by the hash of `SOURCES`, in
    simulator/__pycache__ (or the user's cache where that is not writable), so that an edit
    of any of them compiles every loop anew, once."""
    here = Path(__file__).resolve().parent / "__pycache__"
    base = here if os.access(here if here.exists() else here.parent, os.W_OK) else (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spectune")
    folder = base / f"numba-{sources_hash()}"
    if base == here and not folder.exists():  # (the caches of this checkout's sources before
        # this edit, never read again; not in the user's cache, which other installs share)
        for old in base.glob("numba-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    return str(folder)
