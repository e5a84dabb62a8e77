"""Acceptance replay: which drafts each simulated request gets accepted, from a speculation trace.

A step that drafts k tokens at output position t accepts exactly min(k, run[t]) (docs/design.md), so
a recorded trace replays any policy's acceptance. Workload request i uses trace request i mod M;
when the workload asks for more output tokens than were recorded, the recording is repeated (tiled)
to the needed length, and when fewer, it is cut. A parametric trace is generated for the workload's
own lengths, so nothing is tiled.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simulator.errors import ConfigError
from traces import SIGNALS, SpeculationTrace


class AcceptanceReplay:
    """Per-request accepted runs and signals, sized to the workload's output lengths."""

    def __init__(self, trace: SpeculationTrace, output_tokens: np.ndarray) -> None:
        self.trace = trace
        self.output_tokens = np.asarray(output_tokens, dtype=np.int64)
        self.available = trace.signals_available()
        recorded = trace.request_lengths()  # a lazy trace answers without drawing
        self.tiled = bool(np.any(
            recorded[np.arange(len(self.output_tokens)) % len(recorded)] < self.output_tokens))
        self._signal = lru_cache(maxsize=4096)(self._signal_uncached)

    def __len__(self) -> int:
        return len(self.output_tokens)

    def run(self, index: int) -> np.ndarray:
        """run[t] for t in 0..N-1 of workload request `index` (int64 array of length N)."""
        rec = self.trace.requests[index % len(self.trace)]
        return _fit(rec.run, int(self.output_tokens[index])).astype(np.int64, copy=False)

    @property
    def limits_proposals(self) -> bool:
        """The trace says how many tokens the drafter could propose at each position."""
        return "proposable" in self.available

    def proposable(self, index: int) -> np.ndarray:
        """Per position, how many drafts the drafter can propose (only if `limits_proposals`)."""
        return self._signal(index, "proposable")

    def signal(self, index: int, name: str) -> np.ndarray:
        """A per-position signal (kl, draft_top1, ...) of workload request `index`."""
        if name not in SIGNALS:
            raise KeyError(f"unknown signal {name!r}; known: {', '.join(SIGNALS)}")
        if name not in self.available:
            raise KeyError(f"the speculation trace has no {name!r} signal")
        return self._signal(index, name)

    def _signal_uncached(self, index: int, name: str) -> np.ndarray:
        rec = self.trace.requests[index % len(self.trace)]
        return _fit(getattr(rec, name), int(self.output_tokens[index]))

    def describe(self) -> dict:
        meta = dict(self.trace.meta)
        meta["trace_requests"] = len(self.trace)
        meta["tiled_to_workload_lengths"] = bool(self.tiled)
        return meta


class Lookahead:
    """What an oracle may know of the running requests' futures (simulation only;
    `StepContext.lookahead`): called with a request id, its accepted runs (run[t] for every
    output position); `probabilities`, each position's chance of acceptance where the trace has
    it (a parametric trace's p_t), not the draws."""

    def __init__(self, batch, replay: AcceptanceReplay) -> None:
        self._by_id = {request.request_id: request for request in batch}
        self._replay = replay

    def __call__(self, request_id: int) -> np.ndarray:
        return self._by_id[request_id].run

    def probabilities(self, request_id: int) -> np.ndarray:
        if "accept_prob" not in self._replay.available:
            raise ConfigError("this speculation trace has no per-position acceptance "
                              "probability (accept_prob): an oracle that knows probabilities "
                              "needs a parametric acceptance (iid:, beta:, markov:)")
        return self._replay.signal(self._by_id[request_id].index, "accept_prob")


def signals_needed(policy) -> set[str]:
    """The per-position signals a policy reads from a trace (its own, and the draft's top-1 and
    entropy where it stops a chain early)."""
    needed = set(type(policy).signals)
    if type(policy).uses_draft_stop:
        needed |= {"draft_top1", "draft_entropy"}
    return needed


def replay_for(acceptance: SpeculationTrace, output_tokens: np.ndarray, policy,
               k_max: int) -> AcceptanceReplay:
    """The replay of `acceptance` for these output lengths, refused with a clear error when the
    trace cannot replay k up to k_max or lacks a signal `policy` reads."""
    max_run = acceptance.meta.get("max_run")
    tree = acceptance.meta.get("tree")
    # a draft tree ends at its depth: a run there is exact, and a deeper k drafts the same tree
    capped_by_tree = bool(tree) and max_run == max(len(p) for p in tree)
    if isinstance(max_run, int) and k_max > max_run and not capped_by_tree:
        raise ConfigError(
            f"the speculation trace caps accepted runs at {max_run} (a run of {max_run} means "
            f"'at least {max_run}'), so it cannot replay k up to k_max={k_max}; "
            f"use --k-max {max_run} or record with a larger max run"
        )
    replay = AcceptanceReplay(acceptance, output_tokens)
    needed = signals_needed(policy)
    if needed - replay.available:
        missing = ", ".join(sorted(needed - replay.available))
        raise ConfigError(f"policy {policy.name!r} needs signals the speculation trace lacks: "
                          f"{missing}; record them, or use a parametric acceptance model")
    return replay


#: a cap that never binds (no stop ahead): above any k an engine drafts
UNCAPPED = 1 << 30


def stop_lengths(stops: np.ndarray) -> np.ndarray:
    """Per position g, the drafts a chain starting at g takes under a stop rule that fires after
    the tokens where `stops` is True: through the first stop at or after g, UNCAPPED where none
    comes (past the request's end a chain reads its last position, which then did not stop)."""
    at = np.arange(len(stops), dtype=np.int64)
    first = np.minimum.accumulate(np.where(stops, at, UNCAPPED)[::-1])[::-1]
    return np.where(first < UNCAPPED, first - at + 1, UNCAPPED)


def _fit(values: np.ndarray, n: int) -> np.ndarray:
    """Cut or tile `values` to length n."""
    if len(values) >= n:
        return values[:n]
    reps = -(-n // len(values))
    return np.concatenate([values] * reps)[:n]  # np.tile's result, in a third of its time
