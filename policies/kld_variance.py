"""`kld_variance`: DSDE, speculation length from the stability of the draft's KL divergence.

Yang, Choi, Moon, Jang, Jeon 2025, "DSDE: Dynamic Speculative Decoding with KLD Stability for
Real-World Serving", arXiv 2509.01083; authors' code: samsungsds-research-paper/DSDE,
vllm/spec_decode/dynamic_scheduler.py. Rule: docs/policies.md §4.

Why: KL(target ‖ draft) measures how far the drafter is from the target at each drafted position.
DSDE drafts long while that divergence is low *and* stable, and falls back to a short chain when it
is high or has recently become volatile: a burst of variance in the newest third of the history,
relative to the whole, predicts rejections better than the level alone. Where this follows the
authors' code rather than docs/policies.md, what a simulator cannot observe, and the guards against
infinite or NaN KL: docs/policy-kld-variance.md.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policies.base import DraftOutcome, Policy, StepContext
from policies.kernels import compiled
from policies.registry import register
from policies.rows import RowPool

KL_CEILING = math.log(1e8)  # the largest KL the authors' 1e-8-clamped computation reports
RATIO_IF_FLAT = 20.0  # the code's R when the long-window variance is below 1e-6
_K_LIMIT = 64
#: the longest history whose variances the compiled loop sums (numpy sums up to 128 values in
#: one block; a longer one, with activation_tokens above it, takes the numpy code)
COMPILED_HISTORY = 128


def clean_kl(values) -> np.ndarray:
    """Observed KL values as float64: NaN dropped, clipped to [0, KL_CEILING] (+inf -> ceiling;
    the two ufuncs rather than ndarray.clip's Python wrapper; compiled where the simulator's
    loops run: policies/compiled.py)."""
    kl = np.asarray(values, dtype=np.float64).ravel()
    loops = compiled()
    if loops is not None:
        return loops.clean_kl(kl, KL_CEILING)
    return np.minimum(np.maximum(kl[~np.isnan(kl)], 0.0), KL_CEILING)


#: ndarray.sum without its Python wrapper (the same reduction): observe weighs two histories
#: per request per step
_add = np.add.reduce


def weighted_variance(values: np.ndarray, decay: float) -> float:
    """Variance with weights decay^age, age 0 = the last (newest) value."""
    weights, total = history_weights(decay, len(values))
    mean = float(_add(weights * values) / total)
    return float(_add(weights * (values - mean) ** 2) / total)


@functools.lru_cache(maxsize=1024)
def history_weights(decay: float, n: int) -> tuple[np.ndarray, np.float64]:
    """decay^age for ages n - 1 .. 0, and their sum: the same for every history of n values,
    so computed once (observe weighs two histories per request per step)."""
    weights = decay ** np.arange(n - 1, -1, -1, dtype=np.float64)
    weights.flags.writeable = False
    return weights, weights.sum()


def variance_ratio(history: np.ndarray, decay: float) -> float:
    """R: weighted variance of the newest third over that of the whole history."""
    n = len(history)
    if n < 2:
        return 0.0
    short = max(1, n // 3)
    loops = compiled()
    if loops is not None and n <= COMPILED_HISTORY:  # the same floats, compiled
        return loops.variance_ratio(np.ascontiguousarray(history, dtype=np.float64),
                                    *history_weights(decay, n), *history_weights(decay, short),
                                    RATIO_IF_FLAT)
    v_long = weighted_variance(history, decay)
    if v_long < 1e-6:
        return RATIO_IF_FLAT
    return weighted_variance(history[-short:], decay) / v_long


def dsl_step(ratio: float, mean_kl: float, k_min: int, k_max: int, alpha: float,
             temperature: float) -> int:
    """The code's `_dsl_step`: k between k_min and k_max, shorter as R·(exp(alpha·D) - 1) grows."""
    d = mean_kl if abs(temperature) < 1e-8 else mean_kl / (temperature + 1e-8)
    x = alpha * d
    scale = math.exp(x) - 1.0 if x < 700.0 else math.inf
    product = 0.0 if ratio == 0.0 else ratio * scale
    if product <= 1.0:
        return max(k_min, math.ceil((k_max - k_min) * (1.0 - product) + k_min))
    return k_min


def warmup_bounds(accepted: Sequence[int], kls: Sequence[float], k_min_cfg: int,
                  k_max_cfg: int) -> tuple[int, int]:
    """(k_min_r, k_max_r) from the warm-up's accepted counts and KL values (`KLScheduler`)."""
    if not accepted:
        return k_min_cfg, k_max_cfg
    mean_kl = float(np.mean(kls)) if len(kls) else 0.0
    max_kl = float(np.max(kls)) if len(kls) else 1.0
    if max_kl == 0.0:
        max_kl = 1.0
    k_max_r = min(k_max_cfg, max(k_min_cfg, round(max(accepted) * (1 + 0.5 * mean_kl / max_kl))))
    k_min_r = min(k_max_r, max(k_min_cfg, math.ceil(k_max_r * 0.1)))
    return k_min_r, k_max_r


@dataclass
class _Request:
    """One request's DSDE state."""

    k: int
    history: deque
    warm_accepted: list = field(default_factory=list)
    warm_kl: list = field(default_factory=list)
    bounds: tuple[int, int] | None = None  # (k_min_r, k_max_r) once warm-up is over


class RequestRows(RowPool):
    """Requests' DSDE state as arrays, a row each: what a compiled run of steps reads and
    updates in place (simulator/stepped.py). The warm-up's accepted counts are kept as their
    count and largest, all `warmup_bounds` reads of them."""

    def __init__(self, width: int, rows: int = 64) -> None:
        self.width = width  # activation_tokens: the history's and the warm-up KL's length
        super().__init__(rows)

    def _extend(self, n: int, rows: int) -> None:
        for name, dtype, shape in (("k", np.int64, ()), ("ready", np.bool_, ()),
                                   ("k_min", np.int64, ()), ("k_max", np.int64, ()),
                                   ("history", np.float64, (self.width,)),
                                   ("history_len", np.int64, ()),
                                   ("warm_kl", np.float64, (self.width,)),
                                   ("warm_kl_len", np.int64, ()),
                                   ("warm_count", np.int64, ()),
                                   ("warm_most", np.int64, ())):
            grown = np.zeros((rows, *shape), dtype=dtype)
            if n:
                grown[:n] = getattr(self, name)
            setattr(self, name, grown)

    def rows(self, st_of: dict[int, _Request], ids: Sequence[int], k_init: int) -> np.ndarray:
        """Each request's row, a new one (at k_init) for one without state; a state kept as a
        `_Request` (`st_of`) moves into its row."""
        out = np.empty(len(ids), dtype=np.int64)
        for i, rid in enumerate(ids):
            row, new = self.row(rid)
            if new:
                self._put(row, st_of.pop(rid, None) or _Request(k_init, deque()))
            out[i] = row
        return out

    def _put(self, row: int, st: _Request) -> None:
        history, warm_kl = list(st.history), st.warm_kl
        self.k[row] = st.k
        self.ready[row] = st.bounds is not None
        self.k_min[row], self.k_max[row] = st.bounds or (0, 0)
        self.history[row, :len(history)] = history
        self.history_len[row] = len(history)
        self.warm_kl[row, :len(warm_kl)] = warm_kl
        self.warm_kl_len[row] = len(warm_kl)
        self.warm_count[row] = len(st.warm_accepted)
        self.warm_most[row] = max(st.warm_accepted, default=0)

    def drop(self, request_id: int) -> None:
        """Free a request's row (it finished)."""
        self.release(request_id)

    def take(self, request_id: int, maxlen: int) -> _Request | None:
        """A request's state out of its row, as a `_Request` (None: it has no row)."""
        row = self.release(request_id)
        if row is None:
            return None
        n, warm = int(self.history_len[row]), int(self.warm_kl_len[row])
        return _Request(int(self.k[row]), deque(self.history[row, :n].tolist(), maxlen=maxlen),
                        [int(self.warm_most[row])] * int(self.warm_count[row]),
                        self.warm_kl[row, :warm].tolist(),
                        (int(self.k_min[row]), int(self.k_max[row])) if self.ready[row]
                        else None)


@register
@dataclass
class KldVariance(Policy):
    """DSDE: per-request k from the variance ratio of the KL history, capped by the batch mean."""

    name: ClassVar[str] = "kld_variance"
    description: ClassVar[str] = (
        "DSDE: per-request k from KL level and short/long variance ratio, batch SL cap")
    signals: ClassVar[frozenset[str]] = frozenset({"kl"})

    k_init: int | None = field(default=None, metadata={
        "help": "k of a new request during warm-up (unset: min(5, k_max_cfg))"})
    k_min_cfg: int = field(default=1, metadata={
        "help": "lower bound of every k (DSDE's config default is 6)"})
    k_max_cfg: int = field(default=20, metadata={"help": "upper bound of every k",
                                                   "grid": (4, 8, 20)})
    activation_tokens: int = field(default=100, metadata={
        "help": "W: KL values kept per request; warm-up lasts until W are observed"})
    decay: float = field(default=0.9, metadata={"help": "weight decay^age in the variances"})
    alpha: float = field(default=2.0, metadata={"help": "S = exp(alpha·D) - 1",
                                                  "bounds": (0.5, 4.0)})
    cap: bool = field(default=True, metadata={
        "help": "SL cap: no k above ceil(mean k of the batch's post-warm-up requests)"})
    temperature: float = field(default=0.0, metadata={
        "help": "sampling temperature; D is divided by it when > 0"})

    def __post_init__(self) -> None:
        def integer(key: str, lo: int, hi: int) -> None:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{key} must be an integer in {lo}..{hi}, got {value!r}")

        integer("k_max_cfg", 1, _K_LIMIT)
        integer("k_min_cfg", 0, self.k_max_cfg)
        if self.k_init is None:  # DSDE's 5, within a searched k_max_cfg below it
            self.k_init = max(self.k_min_cfg, min(5, self.k_max_cfg))
        integer("k_init", self.k_min_cfg, self.k_max_cfg)
        integer("activation_tokens", 1, 1_000_000)
        for key, ok, rule in (
            ("decay", lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
            ("alpha", lambda v: 0.0 < v < math.inf, "> 0 and finite"),
            ("temperature", lambda v: 0.0 <= v < math.inf, ">= 0 and finite"),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise ValueError(f"{key} must be a number {rule}, got {value!r}")
        if not isinstance(self.cap, bool):
            raise ValueError(f"cap must be true or false, got {self.cap!r}")
        self._requests: dict[int, _Request] = {}
        #: the states a compiled run of steps keeps (`request_rows`), a request's in one place
        self._rows: RequestRows | None = None

    def _state(self, request_id: int) -> _Request:
        st = self._held(request_id)
        if st is None:
            st = _Request(self.k_init, deque(maxlen=self.activation_tokens))
            self._requests[request_id] = st
        return st

    def _held(self, request_id: int) -> _Request | None:
        """A request's state as a `_Request` (taken out of its row if it is in one)."""
        st = self._requests.get(request_id)
        if st is None and self._rows is not None and request_id in self._rows.row_of:
            st = self._requests[request_id] = self._rows.take(request_id,
                                                              self.activation_tokens)
        return st

    def request_rows(self, ids: Sequence[int]) -> tuple[RequestRows, np.ndarray]:
        """The states of these requests as arrays, and their rows: a compiled run of steps
        decides, observes and updates them there (simulator/stepped.py)."""
        if self._rows is None:
            self._rows = RequestRows(self.activation_tokens)
        return self._rows, self._rows.rows(self._requests, ids, self.k_init)

    def bounds(self, request_id: int) -> tuple[int, int] | None:
        """(k_min_r, k_max_r) of a request past warm-up, else None."""
        st = self._held(request_id)
        return None if st is None else st.bounds

    def choose(self, ctx: StepContext) -> Sequence[int]:
        out = []
        for r in ctx.requests:
            st = self._held(r.request_id)
            k = self.k_init if st is None else st.k
            out.append(max(0, min(k, self.k_max_cfg, ctx.k_max)))
        return out

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        proposed: dict[int, int] = {}
        pool: list[int] = []  # k of requests already past warm-up that drafted: the cap's mean
        for o in outcomes:
            st = self._state(o.request_id)
            kls = clean_kl(o.signals.get("kl", ()))
            was_ready = st.bounds is not None
            st.history.extend(kls.tolist())
            if not was_ready:
                if len(st.history) < self.activation_tokens:
                    self._warm_up(st, o.accepted, kls)
                    continue
                st.bounds = warmup_bounds(st.warm_accepted, st.warm_kl, self.k_min_cfg,
                                          self.k_max_cfg)
                st.warm_accepted, st.warm_kl = [], []
            if kls.size == 0:
                continue  # nothing usable observed: keep k
            k_min_r, k_max_r = st.bounds
            ratio = variance_ratio(np.fromiter(st.history, np.float64, len(st.history)),
                                   self.decay)
            # kls.mean() without its Python wrapper: the same sum, divided by the same count
            mean_kl = float(_add(kls) / len(kls))
            k = dsl_step(ratio, mean_kl, k_min_r, k_max_r, self.alpha, self.temperature)
            proposed[o.request_id] = k
            if was_ready and o.k > 0:
                pool.append(k)
        # the mean of a few small ints, exact in a float: np.mean's float without its wrappers
        cap = math.ceil(sum(pool) / len(pool)) if self.cap and pool else None
        for rid, k in proposed.items():
            self._requests[rid].k = k if cap is None else min(k, cap)

    def _warm_up(self, st: _Request, accepted: int, kls: np.ndarray) -> None:
        st.warm_accepted.append(int(accepted))
        st.warm_kl.extend(kls.tolist())
        if accepted >= st.k:
            st.k = min(st.k * 2 if st.k > 0 else 1, self.k_max_cfg)
        else:
            st.k = max(st.k, self.k_min_cfg)

    def finish(self, request_id: int) -> None:
        self._requests.pop(request_id, None)
        if self._rows is not None:
            self._rows.drop(request_id)
