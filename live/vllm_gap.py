"""vLLM's host time between iterations, fitted from served runs.

The iteration log times a step's forward pass, sampling and proposal; between two steps the
engine also schedules, processes outputs and streams them, and that time grows with the
requests in the step and with whether the step verified drafts. A run's busy time (the union of
its requests' send-to-finish intervals, from the client's clock) minus its logged iteration time
is that gap summed over its iterations, so one run gives one equation

    busy - sum(elapsed) = fixed * iterations + per_request * sum(requests per step)
                          + speculative_step * (steps that verified drafts)

and the runs together give the three coefficients by non-negative least squares. The profile
session cannot measure this (its shapes start and stop on the client's clock, which adds a
per-shape cost); served runs can. Measured figures: docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

RUN_FILES = ("iterations.csv", "requests.csv")
MIN_RUNS = 3


class GapFitError(ValueError):
    """Runs that cannot give the gap, with what to do."""


@dataclass(frozen=True)
class IterationGap:
    """Host time of one vLLM iteration: fixed + per request in the step + once per step that
    verified drafts; fitted on `runs` runs of `iterations` iterations, with the fit's residual
    per iteration (root mean square over runs)."""

    fixed_s: float
    per_request_s: float
    speculative_step_s: float
    runs: int
    iterations: int
    rms_s: float

    def to_meta(self) -> dict:
        return asdict(self)


def find_runs(folders: Sequence[Path]) -> list[Path]:
    """Every folder at or under `folders` that holds a served run's iterations and requests."""
    runs: set[Path] = set()
    for folder in folders:
        if not folder.is_dir():
            raise GapFitError(f"{folder}: not a folder (give folders of measured vLLM runs, as "
                              f"spectune validate --engine vllm writes them)")
        runs.update(p.parent for p in folder.rglob(RUN_FILES[0])
                    if (p.parent / RUN_FILES[1]).is_file())
    return sorted(runs)


def busy_seconds(sent: np.ndarray, finish: np.ndarray) -> float:
    """The length of the union of [sent, finish] intervals: the time the engine had work."""
    order = np.argsort(sent, kind="stable")
    total, start, end = 0.0, None, None
    for s, f in zip(np.asarray(sent)[order], np.asarray(finish)[order]):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, f
        else:
            end = max(end, f)
    return total + (end - start if end is not None else 0.0)


def run_terms(run: Path) -> tuple[np.ndarray, float]:
    """One run's equation: (iterations, sum of requests per step, steps with drafts) and the
    gap they sum to (busy time minus logged iteration time), in seconds."""
    try:
        its = pd.read_csv(run / RUN_FILES[0])
        reqs = pd.read_csv(run / RUN_FILES[1])
        requests, drafted, gap = served_gap(its, reqs)
    except (OSError, KeyError, AttributeError, pd.errors.ParserError) as err:
        raise GapFitError(f"{run}: not a measured vLLM run ({err}); its iterations.csv and "
                          f"requests.csv are written by spectune validate --engine vllm") from None
    if len(requests) == 0 or len(reqs) == 0:
        raise GapFitError(f"{run}: no iterations or no requests; measure the run again")
    terms = np.array([len(requests), float(requests.sum()), float((drafted > 0).sum())])
    return terms, gap


def served_gap(iterations: pd.DataFrame, requests: pd.DataFrame
               ) -> tuple[pd.Series, pd.Series, float]:
    """Each of a served run's iterations' requests and drafts (dummy iterations left out), and
    the host time between them in all: busy time less logged iteration time, in seconds."""
    its = iterations[~iterations.dummy.astype(bool)] if "dummy" in iterations else iterations
    busy = busy_seconds(requests.sent_s.to_numpy(), requests.finish_s.to_numpy())
    return (its.context_requests + its.generation_requests,
            its.generation_tokens - its.generation_requests,
            busy - float(its.elapsed_ms.sum()) / 1000)


def fit_iteration_gap(runs: Sequence[Path]) -> IterationGap:
    """The three coefficients over `runs` (at least MIN_RUNS, with runs that speculate and
    runs that do not, at more than one load, for the terms to be told apart)."""
    from scipy.optimize import nnls

    if len(runs) < MIN_RUNS:
        raise GapFitError(f"{len(runs)} measured run(s) found; the gap needs at least "
                          f"{MIN_RUNS}, with and without speculation, at two rates or more")
    pairs = [run_terms(run) for run in runs]
    terms = np.array([t for t, _ in pairs])
    gaps = np.array([g for _, g in pairs])
    coef, _ = nnls(terms, gaps)
    per_iteration = (gaps - terms @ coef) / terms[:, 0]
    return IterationGap(float(coef[0]), float(coef[1]), float(coef[2]), runs=len(runs),
                        iterations=int(terms[:, 0].sum()),
                        rms_s=float(np.sqrt(np.mean(per_iteration ** 2))))
