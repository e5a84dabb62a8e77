"""`batch_adaptive`: one k for the whole batch, looked up from a batch size -> k table.

Su, Giannoula, Pekhimenko 2023, "The Synergy of Speculative Decoding and Batching" (arXiv
2310.18813; docs/policies.md §2, mechanism from secondary descriptions): the best k falls as the
batch grows, because a bigger batch makes each verified token dearer (the verify pass leaves the
memory-bound regime) while the expected tokens per draft stay the same. The table is the user's
(vLLM ranges or TensorRT-LLM's `draft_len_schedule`) or derived from the engine's cost model, the
paper's procedure. How each form is read, and vLLM V0's `disable_by_batch_size`:
docs/policy-batch-adaptive.md.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from policies.base import Policy, StepContext, StepCost, price_steps
from policies.registry import register
from policies.vocabulary import expected_emitted

K_LIMIT = 64  # the largest k any table may name (the engine's own k_max is at most 64)
DRAFT_LEN_FORMS = ("up_to", "at_least")

Row = tuple[int, int, int]  # (bs_lo, bs_hi, k), inclusive


@register
@dataclass
class BatchAdaptive(Policy):
    """Batch size -> k, from a user table or derived by argmin_k T_step(B, k) / E(k).

    Without `disable_by_batch_size` the k depends only on the running set's size, so the class
    declares `stateless_per_batch` and the engine may cost whole segments at once. vLLM V0's
    disabling is sticky per request (history, not just the running set), so such a policy becomes
    a `_StickyBatchAdaptive`, which is the same class with `stateless_per_batch = False`.
    """

    name: ClassVar[str] = "batch_adaptive"
    description: ClassVar[str] = (
        "one k for the batch from a batch-size table: vLLM ranges, TensorRT-LLM "
        "draft_len_schedule, or derived from the cost model (Su et al. 2023)")
    stateless_per_batch: ClassVar[bool] = True

    schedule: list[list[int]] | None = field(default=None, metadata={
        "help": "vLLM num_speculative_tokens_per_batch_size: [[bs_lo, bs_hi, K], ...], inclusive, "
                "sorted, from 1; beyond the last range its K applies (unset: derive the table)"})
    draft_len_schedule: dict[int, int] | None = field(default=None, metadata={
        "help": "TensorRT-LLM draft_len_schedule {batch_size: draft_len}; read as "
                "draft_len_schedule_form says"})
    draft_len_schedule_form: str = field(default="up_to", metadata={
        "help": "up_to: a key is the largest batch size its draft_len covers, larger batches "
                "get 0 (TensorRT-LLM main); at_least: a key is the smallest batch size it "
                "covers, key 1 required (earlier TensorRT-LLM)"})
    alpha: float = field(default=0.7, metadata={
        "help": "derived table: per-token acceptance probability used for E(k)",
        "bounds": (0.3, 0.95)})
    context_tokens: int = field(default=1024, metadata={
        "help": "derived table: representative context length of every request"})
    max_batch: int = field(default=256, metadata={
        "help": "derived table: largest batch size tabulated (larger ones use its k)"})
    disable_by_batch_size: int | None = field(default=None, metadata={
        "help": "vLLM V0: when running requests >= this, k=0 for that step's requests, and they "
                "never speculate again (sticky per request)"})

    @classmethod
    def unused_parameters(cls, pinned: Mapping[str, Any]) -> frozenset[str]:
        """A given table is not derived: the derivation's parameters do nothing."""
        if pinned.get("schedule") is not None or pinned.get("draft_len_schedule") is not None:
            return frozenset({"alpha", "context_tokens", "max_batch"})
        return frozenset()

    def __post_init__(self) -> None:
        if self.schedule is not None and self.draft_len_schedule is not None:
            raise ValueError("give either schedule (vLLM ranges) or draft_len_schedule "
                             "(TensorRT-LLM), not both")
        if self.draft_len_schedule_form not in DRAFT_LEN_FORMS:
            raise ValueError(f"draft_len_schedule_form must be one of {', '.join(DRAFT_LEN_FORMS)}"
                             f", got {self.draft_len_schedule_form!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.context_tokens < 1:
            raise ValueError(f"context_tokens must be >= 1, got {self.context_tokens}")
        if not 1 <= self.max_batch <= 4096:
            raise ValueError(f"max_batch must be in 1..4096 (deriving the table costs "
                             f"O(max_batch^2) cost-model calls), got {self.max_batch}")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(
                f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")
        self._given: list[Row] | None = None
        if self.schedule is not None:
            self._given = _from_ranges(self.schedule)
        elif self.draft_len_schedule is not None:
            self._given = _from_draft_len_schedule(self.draft_len_schedule,
                                                   self.draft_len_schedule_form, self.max_batch)
        self._derived: dict[int, list[Row]] = {}  # by k_max, for the cost model below
        self._derived_for = None  # a weak reference to the cost model the cache was built for
        self._disabled: set[int] = set()
        if self.disable_by_batch_size is not None and type(self) is BatchAdaptive:
            self.__class__ = _StickyBatchAdaptive  # history-dependent: no per-batch fast path

    def may_draft(self, k_max: int) -> bool:
        return k_max > 0 and (self._given is None or any(k > 0 for _, _, k in self._given))

    # -- the table ---------------------------------------------------------------------------

    def table(self, cost: StepCost, k_max: int) -> list[Row]:
        """The active table in vLLM's range form [(bs_lo, bs_hi, k), ...] (ready to export).

        The user's table (normalised: TensorRT-LLM keys become ranges, gaps filled) or the one
        derived from `cost`, searching k in 0..k_max. Derived tables are cached per cost-model
        object and k_max: `choose` derives once, on its first call.
        """
        if self._given is not None:
            return list(self._given)
        if _deref(self._derived_for) is not cost:
            self._derived, self._derived_for = {}, _ref(cost)
        if k_max not in self._derived:
            self._derived[k_max] = derive_table(cost, self.alpha, self.context_tokens,
                                                self.max_batch, k_max)
        return list(self._derived[k_max])

    def k_for(self, batch_size: int, cost: StepCost, k_max: int) -> int:
        """The table's k for `batch_size`, clamped to 0..k_max."""
        rows = self.table(cost, k_max)
        i = bisect_left([hi for _, hi, _ in rows], batch_size)
        k = rows[min(i, len(rows) - 1)][2]
        return max(0, min(k, k_max))

    # -- the protocol --------------------------------------------------------------------------

    def choose(self, ctx: StepContext) -> Sequence[int]:
        b = len(ctx.requests)
        if b == 0:
            return []
        k = self.k_for(b, ctx.cost, ctx.k_max)
        if self.disable_by_batch_size is None:
            return [k] * b
        if b >= self.disable_by_batch_size:
            # vLLM V0 `_maybe_disable_speculative_tokens`: "Once num_speculative_tokens is set
            # to 0, the spec decode of this request will be disabled forever."
            self._disabled.update(r.request_id for r in ctx.requests)
        return [0 if r.request_id in self._disabled else k for r in ctx.requests]

    def k_by_batch(self, cost: StepCost, k_max: int, largest: int) -> list[int] | None:
        if self.disable_by_batch_size is not None:  # (sticky per request: not by batch alone)
            return None
        return [0] + [self.k_for(b, cost, k_max) for b in range(1, largest + 1)]

    def finish(self, request_id: int) -> None:
        self._disabled.discard(request_id)


class _StickyBatchAdaptive(BatchAdaptive):
    """`batch_adaptive` with `disable_by_batch_size`: k depends on which requests were ever in
    a batch at or above the threshold, so the engine must ask every step."""

    stateless_per_batch: ClassVar[bool] = False


def derive_table(cost: StepCost, alpha: float, context_tokens: int, max_batch: int,
                 k_max: int) -> list[Row]:
    """Su et al.'s offline table: for B in 1..max_batch, k*(B) = argmin_k T_step(B, k) / E(k).

    T_step is the engine's cost model for B requests of `context_tokens` each drafting k (draft
    chain + verify + overhead, simulator/step_cost.py); E(k) = (1 - alpha^(k+1)) / (1 - alpha).
    Every k in 0..k_max is scanned (step times can jump at CUDA-graph buckets and the compute
    knee, docs/policies.md §0); ties go to the smaller k. Runs of equal k merge into ranges.
    """
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    emitted = [expected_emitted(alpha, k) for k in range(k_max + 1)]
    every = _uniform_steps_s(cost, context_tokens, max_batch, k_max)
    best: list[int] = []
    for b in range(1, max_batch + 1):
        times = every[b - 1] if every is not None else price_steps(
            cost, [[k] * b for k in range(k_max + 1)], [context_tokens] * b)
        per_token = [t / e for t, e in zip(times, emitted)]
        best.append(min(range(k_max + 1), key=per_token.__getitem__))
    return _merge(best)


def _uniform_steps_s(cost: StepCost, context_tokens: int, max_batch: int,
                     k_max: int) -> list[list[float]] | None:
    """T_step of B requests at k for every B in 1..max_batch and k in 0..k_max, in one call
    where the cost model prices a step from its verify pass's sums (`chain_sums_s`); None
    where it does not."""
    chain_sums = getattr(cost, "chain_sums_s", None)
    if chain_sums is None:
        return None
    b = np.repeat(np.arange(1, max_batch + 1, dtype=np.int64), k_max + 1)
    k = np.tile(np.arange(k_max + 1, dtype=np.int64), max_batch)
    c = context_tokens - 1  # each request's KV before the verify pass
    times = chain_sums(b, b * k, b * c, b * ((k + 1) * c + (k + 1) * (k + 2) // 2))
    if times is None:
        return None
    return [times[i:i + k_max + 1] for i in range(0, len(times), k_max + 1)]


def _merge(ks_by_batch: Sequence[int]) -> list[Row]:
    """[k(1), k(2), ...] -> inclusive ranges of equal k."""
    rows: list[Row] = []
    for b, k in enumerate(ks_by_batch, start=1):
        if rows and rows[-1][2] == k:
            rows[-1] = (rows[-1][0], b, k)
        else:
            rows.append((b, b, k))
    return rows


def _from_ranges(schedule: Sequence[Sequence[int]]) -> list[Row]:
    """Validate vLLM's `num_speculative_tokens_per_batch_size` and fill its gaps.

    Checks as that validator does (positive inclusive ranges, K >= 0, non-overlapping, the first
    starting at 1), but an unsorted table is an error here rather than sorted silently. A gap
    between ranges carries the previous K forward, as its dense-schedule builder does.
    """
    if not isinstance(schedule, Sequence) or isinstance(schedule, str) or not schedule:
        raise ValueError("schedule must be a non-empty list of [bs_lo, bs_hi, K] ranges")
    rows: list[Row] = []
    for entry in schedule:
        if (not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) != 3
                or not all(_is_int(x) for x in entry)):
            raise ValueError(f"schedule entry {entry!r} is not [bs_lo, bs_hi, K] (three integers)")
        lo, hi, k = (int(x) for x in entry)
        if lo < 1 or hi < lo:
            raise ValueError(f"schedule range {entry!r}: need 1 <= bs_lo <= bs_hi")
        if not 0 <= k <= K_LIMIT:
            raise ValueError(f"schedule range {entry!r}: K must be in 0..{K_LIMIT}")
        if rows and lo <= rows[-1][1]:
            prev = list(rows[-1])
            what = "overlaps" if lo >= rows[-1][0] else "comes before"
            raise ValueError(f"schedule range {entry!r} {what} {prev}: ranges must be sorted "
                             "and non-overlapping")
        if rows and lo > rows[-1][1] + 1:  # a gap: the previous K carries forward
            rows[-1] = (rows[-1][0], lo - 1, rows[-1][2])
        rows.append((lo, hi, k))
    if rows[0][0] != 1:
        raise ValueError(f"schedule must start at batch size 1 (first range {list(rows[0])}) so "
                         "every batch size has a k")
    return rows


def _from_draft_len_schedule(schedule: Mapping, form: str, max_batch: int) -> list[Row]:
    """TensorRT-LLM's `draft_len_schedule` {batch_size: draft_len} as inclusive ranges.

    form "up_to" (TensorRT-LLM main since PR #10860, `get_draft_len_for_batch_size` with
    bisect_left): a key is the largest batch size its draft_len covers, batch sizes above every
    key get 0. The doc's example {4: 4, 8: 2, 32: 1}: 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0.
    form "at_least" (earlier llm_args.py; bisect_right): the entry with the largest key <= batch
    size applies, and key 1 is required. {1: 4, 4: 2, 8: 0}: 1-3 -> 4, 4-7 -> 2, 8+ -> 0.
    Keys may be strings of digits (JSON objects from `--set` have string keys).
    """
    if not isinstance(schedule, Mapping) or not schedule:
        raise ValueError("draft_len_schedule must be a non-empty mapping {batch_size: draft_len}")
    items = []
    for key, value in schedule.items():
        if not (_is_int(key) or (isinstance(key, str) and key.strip().isdigit())):
            raise ValueError(f"draft_len_schedule key {key!r} is not a batch size (an integer)")
        if not _is_int(value):
            raise ValueError(f"draft_len_schedule[{key!r}] = {value!r} is not an integer")
        bs, k = int(key), int(value)
        if bs < 1:
            raise ValueError(f"draft_len_schedule: batch size threshold must be >= 1, got {bs}")
        if not 0 <= k <= K_LIMIT:
            raise ValueError(f"draft_len_schedule[{bs}] = {k}: draft length must be in "
                             f"0..{K_LIMIT}")
        items.append((bs, k))
    items.sort()
    if len({bs for bs, _ in items}) != len(items):
        raise ValueError("draft_len_schedule names a batch size twice")
    rows: list[Row] = []
    if form == "up_to":
        lo = 1
        for bs, k in items:
            rows.append((lo, bs, k))
            lo = bs + 1
        rows.append((lo, max(lo, max_batch), 0))  # beyond every key: speculation off
    else:
        if items[0][0] != 1:
            raise ValueError("draft_len_schedule (form at_least) must include batch size 1")
        for i, (bs, k) in enumerate(items):
            hi = items[i + 1][0] - 1 if i + 1 < len(items) else max(bs, max_batch)
            rows.append((bs, hi, k))
    return rows


def _ref(obj):
    """A weak reference where possible: a deep copy of the policy (one per replica) then
    shares nothing with the cost model instead of copying it."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _deref(ref):
    return None if ref is None else ref()


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
