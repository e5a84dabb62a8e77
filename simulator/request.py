"""A request's state inside the engine, and the walk of its positions under a fixed k (or
under a policy that decides each request's k from its own outcomes alone)."""

from __future__ import annotations

import numpy as np

from simulator.errors import ConfigError
from simulator.kernels import compiled

_NO_CAP = np.zeros(0, dtype=np.int64)  # the compiled walk's cap where it has none


class RequestState:
    """A request inside the engine; policies see it as a read-only `RequestView`."""

    __slots__ = (
        "accepted",
        "arrival_s",
        "cap",
        "chain",
        "chain_at",
        "chain_blocks",
        "chain_drafted",
        "chain_end",
        "chain_feeds",
        "chain_g",
        "chain_k",
        "chain_ks",
        "chain_list",
        "chain_origin",
        "draft_feed",
        "drafted",
        "generated",
        "index",
        "output_tokens",
        "prefilled",
        "prompt_tokens",
        "request_id",
        "reserve",
        "run",
        "signals",
        "steps",
        "summed",
        "trace_at",
    )

    def __init__(self, index: int, request_id: int, arrival_s: float, prompt: int, output: int):
        self.index = index
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt
        self.output_tokens = output
        self.generated = 0
        self.prefilled = 0
        self.steps = 0
        self.drafted = 0
        self.draft_feed = 0  # tokens the next chain's first draft pass feeds (draft_feed.py)
        self.accepted = 0
        self.run: np.ndarray | None = None
        #: the trace's per-position signals the policy reads (simulator/replica.py's submit)
        self.signals: dict[str, np.ndarray] | None = None
        #: drafts the drafter can propose at each position (an n-gram lookup's), or None
        self.cap: list[int] | None = None
        self.reserve = 0
        self.chain: np.ndarray | None = None
        self.chain_k = -1
        self.chain_ks: np.ndarray | None = None
        self.chain_at = 0
        self.chain_g = -1  # chain[chain_at], kept beside it: checked without reading the array
        #: where the replica keeps the batch's sums: the walk as a list, and (capped) its
        #: drafts summed up to each step (chain_drafted[j]: steps before j), for commits
        self.chain_list: list[int] | None = None
        self.chain_drafted: list[int] | None = None
        #: where the replica keeps the batch's sums of a draft model's passes: its draft feed
        #: before each step of its walk, and after the last
        self.chain_feeds: np.ndarray | None = None
        #: under vLLM's scheduler with kept sums: the KV blocks it holds before each step of
        #: its walk, and after the last (simulator/batch_columns.py)
        self.chain_blocks: np.ndarray | None = None
        self.summed = False  # its walk is in the replica's kept sums (simulator/batch_columns.py)
        self.trace_at = -1  # where its trace starts in the replica's TraceStore (stepped.py)
        #: where the replica keeps the batch's sums: the decode step (of the replica's count)
        #: its walk started at, and the one it ends at (its last entry)
        self.chain_origin = self.chain_end = 0

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def draftable(self) -> int | None:
        """Drafts the drafter can propose at the next position (None: no limit): an n-gram
        lookup's match, known to an engine before it verifies, as a proposer runs first."""
        return None if self.cap is None else self.cap[self.generated]


def walk_chain(request: RequestState, k: int) -> None:
    """Make `request.chain[request.chain_at:]` the tokens generated before each remaining step
    if the request asks for k drafts every step (and `request.chain_g` its first entry).

    Step at g drafts d = min(k, cap[g]) (`request.cap`: how many drafts the drafter can propose
    at each position, e.g. an n-gram lookup's; None: no limit), accepts min(d, run[g]) of them
    and emits one more, cut at the request's length: g -> min(g + min(d, run[g]) + 1, N). With
    a cap, `request.chain_ks` holds each step's d. The walk is cached on the request and kept
    while it asks for the same k from where the walk has got to (the fast path resumes it
    segment after segment, advancing `chain_at` and `chain_g`): see `chain_is_current`.
    """
    if chain_is_current(request, k):
        return
    g0, n = request.generated, request.output_tokens
    loops = compiled()
    if loops is not None:  # the same loop, compiled (simulator/compiled.py)
        cap, cap_g0 = request.cap, g0
        if cap is None:
            cap = _NO_CAP
        elif not isinstance(cap, np.ndarray):  # a list (steps read it): its part from g0
            cap, cap_g0 = np.asarray(cap[g0:n], dtype=np.int64), 0
        chain, drafts = loops.walk(request.run, cap, request.cap is not None, cap_g0, g0, n, k)
        request.chain, request.chain_k, request.chain_at, request.chain_g = chain, k, 0, g0
        request.chain_ks = None if request.cap is None else drafts
        return
    caps = None if request.cap is None else np.asarray(request.cap[g0:n], dtype=np.int64)
    if k == 0:
        walked = np.arange(n - g0 + 1, dtype=np.int64)
    else:
        m = n - g0  # positions counted from g0 while walking
        width = np.minimum(request.run[g0:n], k)
        if caps is not None:
            width = np.minimum(width, caps)
        nxt = np.minimum(width + np.arange(1, m + 1, dtype=np.int64), m).tolist()
        walk = [0]
        step = walk.append  # bound once: the loop runs once per step of the request
        p = 0
        while p < m:
            p = nxt[p]
            step(p)
        walked = np.asarray(walk, dtype=np.int64)
    chain = walked + g0
    request.chain, request.chain_k, request.chain_at, request.chain_g = chain, k, 0, g0
    request.chain_ks = None if caps is None else np.minimum(caps[walked[:-1]], k)


#: the `chain_k` of a walk its policy decided step by step (`walk_alone`), not a fixed k
WALKED = -2


def walk_alone(request: RequestState, walker, k_max: int, policy: str = "") -> None:
    """`walk_chain` for a policy that decides each request's k from its own outcomes alone
    (`Policy.walker`): every remaining step asks `walker` (a `RequestWalker`) for its k,
    drafts min(k, cap[g]), accepts min(d, run[g]) and tells the walker, as the step path's
    choose, cap, verification and observe do. The walk runs to the request's end once, so
    its steps' drafts are `chain_ks` and its `chain_k` is WALKED. A k outside 0..k_max is
    refused, as the scheduler refuses a `choose` that gives one. A walker with a `walk_all`
    (start, run, cap) may walk the whole request at once (compiled: heuristic's, gammatune's,
    adaedl's, the oracle's), or return None."""
    g, n = request.generated, request.output_tokens
    whole = getattr(walker, "walk_all", None) if compiled() is not None else None
    walked = None if whole is None else whole(
        g, np.asarray(request.run[g:n], dtype=np.int64),
        None if request.cap is None else np.asarray(request.cap[g:n], dtype=np.int64))
    walk, drafts = walked if walked is not None else _walk_steps(request, walker, k_max, policy)
    request.chain = walk + g
    request.chain_k, request.chain_at, request.chain_g = WALKED, 0, g
    request.chain_ks = drafts


def _walk_steps(request: RequestState, walker, k_max: int, policy: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """`walk_alone`'s walk asked of the walker step after step: the tokens emitted before each
    step and after the last (from 0), and each step's drafts."""
    g, n = request.generated, request.output_tokens
    run = request.run[g:n].tolist()  # counted from g, as the positions below
    cap = None if request.cap is None else np.asarray(request.cap[g:n]).tolist()
    ask, tell = walker.k, walker.saw
    walk, drafts = [0], []
    p, m = 0, n - g
    while p < m:  # plain comparisons: this loop runs once per step of every request
        k = ask(g + p)
        if not 0 <= k <= k_max:
            raise ConfigError(f"policy {policy!r} chose k={k}, outside the engine's "
                              f"0..k_max={k_max}; raise k_max or lower the policy's k")
        if cap is not None and cap[p] < k:
            k = cap[p]
        accepted = (run[p] if run[p] < k else k) if k else 0
        emit = accepted + 1 if accepted < m - p else m - p  # cut at the request's length
        tell(k, emit - 1, emit, g + p)
        p += emit
        walk.append(p)
        drafts.append(k)
    return np.asarray(walk, dtype=np.int64), np.asarray(drafts, dtype=np.int64)


def chain_is_current(request: RequestState, k: int) -> bool:
    """Whether the cached walk is at k and starts where the request is (chain_g mirrors
    chain[chain_at], so no array is read; a request without a walk has chain_k -1).
    `_Stretch.priced` (simulator/replica.py) inlines this test: keep the two alike."""
    return request.chain_k == k and request.chain_g == request.generated
