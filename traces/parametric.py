"""Parametric acceptance: a stand-in speculation trace when nothing was recorded.

A spec string picks how likely each draft token is to match the target:

* ``iid:ALPHA`` — every position of every request matches with probability ALPHA;
* ``beta:A,B`` — each request draws its own alpha ~ Beta(A, B) (easy and hard prompts);
* ``markov:A1,A2,...@L`` — regime switching within a request: segments of geometric length with
  mean L tokens, each with an alpha drawn uniformly from the list (code vs prose, say).

Traces built this way say so (meta["parametric"] = True) and their signals are PROXIES derived
from the model's own acceptance probability, not measurements of any drafter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from traces._checks import count, positive_finite, unit_interval
from traces.errors import TraceError
from traces.speculation import SIGNALS, RequestSpeculation, SpeculationTrace, runs_by_request

DEFAULT_MAX_RUN = 255
_FORMS = ("'iid:ALPHA' (0 <= ALPHA <= 1), 'beta:A,B' (A, B > 0) or 'markov:A1,A2,...@L' "
          "(L >= 1), optionally followed by '~C' (per-position concentration)")
SIGNAL_NOTE = (
    "proxy: accept_prob = p_t (the model's per-position match probability); kl = -ln(1-(1-p_t)^2), "
    "the Bretagnolle-Huber lower bound on KL(target||draft) for total-variation distance 1-p_t; "
    "draft_top1 = p_t (a calibrated draft); draft_entropy = binary entropy of p_t in nats"
)


class ParametricAcceptance:
    """Base of the parsed acceptance models; subclasses are frozen dataclasses."""

    spec: str

    @property
    def mean_alpha(self) -> float | None:
        """Long-run fraction of positions that match, where the model defines one."""
        raise NotImplementedError

    def describe(self) -> str:
        """One human-readable sentence describing the model."""
        raise NotImplementedError

    def position_alphas(self, lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per-position alpha over all requests' positions concatenated (float32)."""
        raise NotImplementedError


@dataclass(frozen=True)
class IidAcceptance(ParametricAcceptance):
    """Every position matches independently with probability alpha."""

    alpha: float
    spec: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", unit_interval("iid alpha", self.alpha))
        if not self.spec:
            object.__setattr__(self, "spec", f"iid:{self.alpha:g}")

    @property
    def mean_alpha(self) -> float:
        return self.alpha

    def describe(self) -> str:
        return f"i.i.d. acceptance: every draft token matches with probability {self.alpha:g}"

    def position_alphas(self, lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.full(int(lengths.sum()), self.alpha, dtype=np.float32)


@dataclass(frozen=True)
class BetaAcceptance(ParametricAcceptance):
    """Each request draws alpha ~ Beta(a, b); positions within it are i.i.d. given alpha."""

    a: float
    b: float
    spec: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "a", positive_finite("beta A", self.a))
        object.__setattr__(self, "b", positive_finite("beta B", self.b))
        if not self.spec:
            object.__setattr__(self, "spec", f"beta:{self.a:g},{self.b:g}")

    @property
    def mean_alpha(self) -> float:
        return self.a / (self.a + self.b)

    def describe(self) -> str:
        return (f"per-request acceptance: each request's alpha ~ Beta({self.a:g}, {self.b:g}) "
                f"(mean {self.mean_alpha:.3g}), i.i.d. within the request")

    def position_alphas(self, lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        alphas = rng.beta(self.a, self.b, size=lengths.size).astype(np.float32)
        return np.repeat(alphas, lengths)


@dataclass(frozen=True)
class MarkovAcceptance(ParametricAcceptance):
    """Regime switching: geometric segments (mean `mean_segment` tokens), alpha per segment.

    A new segment starts at each request's first position and, after that, at each position with
    probability 1/mean_segment; its alpha is drawn uniformly from `alphas` (it may repeat the
    previous one). Segments never continue across requests.
    """

    alphas: tuple[float, ...]
    mean_segment: float
    spec: str = ""

    def __post_init__(self) -> None:
        alphas = tuple(unit_interval("markov alpha", a) for a in self.alphas)
        if not alphas:
            raise TraceError(f"markov acceptance needs at least one alpha; use {_FORMS}")
        mean = positive_finite("markov mean segment length L", self.mean_segment)
        if mean < 1:
            raise TraceError(f"markov mean segment length L must be >= 1 token (got {mean:g})")
        object.__setattr__(self, "alphas", alphas)
        object.__setattr__(self, "mean_segment", mean)
        if not self.spec:
            listed = ",".join(f"{a:g}" for a in alphas)
            object.__setattr__(self, "spec", f"markov:{listed}@{mean:g}")

    @property
    def mean_alpha(self) -> float:
        return float(np.mean(self.alphas))

    def describe(self) -> str:
        listed = ", ".join(f"{a:g}" for a in self.alphas)
        return (f"regime-switching acceptance: segments of geometric length (mean "
                f"{self.mean_segment:g} tokens), each with alpha drawn uniformly from {{{listed}}}")

    def position_alphas(self, lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        total = int(lengths.sum())
        starts = rng.random(total) < 1.0 / self.mean_segment
        starts[np.cumsum(lengths) - lengths] = True
        segment = np.cumsum(starts) - 1
        choice = rng.integers(0, len(self.alphas), size=int(segment[-1]) + 1)
        return np.asarray(self.alphas, dtype=np.float32)[choice][segment]


def split_concentration(spec: str) -> tuple[str, float | None]:
    """'beta:7,3~20' -> ('beta:7,3', 20.0): an optional per-position concentration suffix.

    With it, each position's match probability varies around the model's alpha as
    Beta(alpha·C, (1-alpha)·C): the mean is unchanged, but the proxy signals (KL, draft
    confidence) now vary from token to token the way signal-driven policies expect.
    """
    base, tilde, conc = spec.partition("~")
    if not tilde:
        return spec, None
    try:
        value = float(conc)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise TraceError(f"acceptance spec {spec!r}: the concentration after '~' must be a "
                         f"positive number, e.g. 'beta:7,3~20'")
    return base, value


def parse_acceptance(spec: str) -> ParametricAcceptance:
    """Parse 'iid:ALPHA', 'beta:A,B' or 'markov:A1,A2,...@L' (TraceError for anything else).

    A '~C' concentration suffix is accepted and ignored here (see `split_concentration`)."""
    if isinstance(spec, ParametricAcceptance):
        return spec
    if not isinstance(spec, str):
        raise TraceError(f"acceptance spec must be a string (got {type(spec).__name__})")
    text = split_concentration(spec.strip())[0]
    kind, colon, rest = text.partition(":")
    if not colon or kind not in ("iid", "beta", "markov"):
        raise TraceError(f"unknown acceptance spec {spec!r}; use {_FORMS}")
    if kind == "markov":
        listed, at, mean = rest.partition("@")
        if not at:
            raise TraceError(f"acceptance spec {spec!r} lacks '@L' (mean segment length); "
                             f"use {_FORMS}")
        segment = _numbers(mean, spec)
        if len(segment) != 1:
            raise TraceError(f"acceptance spec {spec!r} needs one number after '@'; use {_FORMS}")
        return MarkovAcceptance(tuple(_numbers(listed, spec)), segment[0], text)
    values = _numbers(rest, spec)
    if kind == "iid" and len(values) == 1:
        return IidAcceptance(values[0], text)
    if kind == "beta" and len(values) == 2:
        return BetaAcceptance(values[0], values[1], text)
    raise TraceError(f"acceptance spec {spec!r} has {len(values)} values; use {_FORMS}")


#: a parametric trace past this many positions is drawn as the simulation reaches its requests
#: (iid and beta models without '~C': the same numbers; LazyParametricTrace)
LAZY_POSITIONS = 1 << 24
#: bytes per position of a trace drawn all at once, at its peak (alpha, p and the gammas,
#: the matches, the runs, four float32 signals and their temporaries): measured 24 (markov)
#: and 38 ('~C'), rounded up
EAGER_BYTES_PER_POSITION = 40


def parametric_trace(
    spec: str | ParametricAcceptance,
    output_tokens: np.ndarray,
    rng: np.random.Generator,
    position_concentration: float | None = None,
    max_run: int = DEFAULT_MAX_RUN,
    lazy: bool | None = None,
) -> SpeculationTrace | LazyParametricTrace:
    """Sample a speculation trace for requests with the given output lengths.

    Per position: alpha from the model; if `position_concentration` c is given,
    p_t ~ Beta(alpha·c, (1-alpha)·c) (mean alpha, positions independent), else p_t = alpha;
    match b_t ~ Bernoulli(p_t); run = run_from_matches(b) capped at max_run, never crossing into
    the next request. Everything is drawn in one vectorised call per quantity over all positions,
    so the same rng state gives the same trace. Signals are proxies (see SIGNAL_NOTE).

    `lazy` (None: past LAZY_POSITIONS positions, where the model allows): a LazyParametricTrace,
    the same trace drawn block by block as it is read. A model that cannot be drawn so (markov,
    or a '~C' concentration) is drawn at once, and refused with its memory estimate where that
    is more than the machine has available.
    """
    if isinstance(spec, str):
        spec, suffix = split_concentration(spec.strip())
        if suffix is not None:
            if position_concentration is not None and position_concentration != suffix:
                raise TraceError(f"two concentrations given: '~{suffix:g}' and "
                                 f"{position_concentration}")
            position_concentration = suffix
    model = parse_acceptance(spec)
    lengths = _lengths(output_tokens)
    max_run = count("max_run", max_run)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (got {type(rng).__name__})")
    total = int(lengths.sum())
    streams = isinstance(model, (IidAcceptance, BetaAcceptance)) and position_concentration is None
    if lazy is None:
        lazy = streams and (total > LAZY_POSITIONS or not fits(total))
    if lazy:
        if not streams:
            raise TraceError(f"acceptance {model.spec!r}: only iid and beta acceptance without "
                             f"'~C' can be drawn as the simulation reaches each request")
        return LazyParametricTrace(model, lengths, rng, max_run,
                                   _meta(model, position_concentration, max_run))
    check_memory(model.spec, total, len(lengths))
    alpha = model.position_alphas(lengths, rng)
    if position_concentration is None:
        p = alpha
    else:
        c = positive_finite("position_concentration", position_concentration)
        p = _beta_around(alpha, c, rng)
    match = rng.random(p.size, dtype=np.float32) < p
    run = runs_by_request(match, lengths, max_run)
    run = run.astype(np.int16 if max_run <= np.iinfo(np.int16).max else np.int32)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    meta = _meta(model, position_concentration, max_run)
    return SpeculationTrace.from_concatenated(run, offsets, meta, signals=_proxy_signals(p))


def _meta(model: ParametricAcceptance, position_concentration: float | None,
          max_run: int) -> dict:
    return {
        "parametric": True,
        "spec": model.spec if position_concentration is None
        else f"{model.spec}~{position_concentration:g}",
        "description": model.describe() if position_concentration is None
        else f"{model.describe()}; per-position probability ~ Beta around alpha "
        f"(concentration {position_concentration:g})",
        "mean_alpha": model.mean_alpha,
        "position_concentration": position_concentration,
        "max_run": max_run,
        "signals": SIGNAL_NOTE,
        "source": f"parametric acceptance model {model.spec} (no drafter was run)",
        "drafter": None,
        "target": None,
    }


def available_memory_bytes() -> int | None:
    """What the machine has available now (Linux /proc/meminfo MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fits(positions: int) -> bool:
    """A trace of this many positions drawn at once fits in the memory available."""
    have = available_memory_bytes()
    return have is None or positions * EAGER_BYTES_PER_POSITION <= have


def check_memory(spec: str, positions: int, requests: int) -> None:
    """Refuse, in one line with the estimate, a trace drawn at once that cannot fit."""
    need = positions * EAGER_BYTES_PER_POSITION
    have = available_memory_bytes()
    if have is not None and need > have:
        raise TraceError(
            f"acceptance {spec!r} is drawn for the whole workload at once: {requests:,} requests "
            f"({positions:,} output positions) need about {need / 2**30:.1f} GiB, and this "
            f"machine has {have / 2**30:.1f} GiB available; use iid or beta acceptance without "
            f"'~C' (drawn as the simulation reaches each request), or fewer requests")


class LazyParametricTrace:
    """parametric_trace's trace for an iid or beta model without a concentration, drawn `block`
    requests at a time as they are read, to the same numbers: beta's per-request alphas are
    drawn first for all requests (as the whole trace draws them), then each block's matches
    continue the generator's float32 stream exactly where the previous block left it. A block
    read again after it was dropped is drawn again from the generator state saved at its start.
    Memory: the alphas, the saved states and `keep` blocks."""

    def __init__(self, model: ParametricAcceptance, lengths: np.ndarray,
                 rng: np.random.Generator, max_run: int, meta: dict, block: int = 4096,
                 keep: int = 16) -> None:
        self.model, self.meta, self.max_run = model, meta, max_run
        self._lengths = np.asarray(lengths, dtype=np.int64)
        self._rng, self._block, self._keep = rng, block, keep
        self._alphas = (rng.beta(model.a, model.b, size=len(lengths)).astype(np.float32)
                        if isinstance(model, BetaAcceptance) else None)
        self._starts: list[dict] = []  # the generator's state at each block drawn so far
        self._blocks: dict[int, SpeculationTrace] = {}
        self.requests = _LazyRequests(self)

    def __len__(self) -> int:
        return len(self._lengths)

    def request_lengths(self) -> np.ndarray:
        return self._lengths

    def signals_available(self) -> frozenset[str]:
        return frozenset(SIGNALS)

    def request(self, index: int) -> RequestSpeculation:
        block, at = divmod(index, self._block)
        if block not in self._blocks:
            while len(self._starts) < block:  # draw the blocks before it, in order
                self._draw(len(self._starts), self._rng)
            self._blocks[block] = self._draw(block, self._rng if block == len(self._starts)
                                             else self._replay(block))
            while len(self._blocks) > self._keep:
                del self._blocks[next(iter(self._blocks))]
        return self._blocks[block].requests[at]

    def _replay(self, block: int) -> np.random.Generator:
        rng = np.random.Generator(type(self._rng.bit_generator)())
        rng.bit_generator.state = self._starts[block]
        return rng

    def _draw(self, block: int, rng: np.random.Generator) -> SpeculationTrace:
        first = block * self._block
        lengths = self._lengths[first:first + self._block]
        if rng is self._rng:
            self._starts.append(rng.bit_generator.state)
        if self._alphas is None:
            p = np.full(int(lengths.sum()), self.model.alpha, dtype=np.float32)
        else:
            p = np.repeat(self._alphas[first:first + len(lengths)], lengths)
        match = rng.random(p.size, dtype=np.float32) < p
        run = runs_by_request(match, lengths, self.max_run)
        run = run.astype(np.int16 if self.max_run <= np.iinfo(np.int16).max else np.int32)
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        keys = [str(i) for i in range(first, first + len(lengths))]
        return SpeculationTrace.from_concatenated(run, offsets, self.meta, keys=keys,
                                                  signals=_proxy_signals(p))


class _LazyRequests(Sequence):
    """The lazy trace's requests, read one at a time (`trace.requests[i]`)."""

    def __init__(self, trace: LazyParametricTrace) -> None:
        self._trace = trace

    def __len__(self) -> int:
        return len(self._trace)

    def __getitem__(self, index):
        if not isinstance(index, (int, np.integer)):
            raise TypeError("a lazy parametric trace's requests are read one at a time")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._trace.request(int(index))


def _beta_around(alpha: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    """p ~ Beta(alpha·c, (1-alpha)·c) as a ratio of float32 gammas (faster than rng.beta).

    alpha of exactly 0 or 1 stays put (the Beta is undefined there); where both gammas underflow
    to 0 (tiny shape parameters) those few positions are redrawn with rng.beta.
    """
    interior = (alpha > 0) & (alpha < 1)
    safe = np.where(interior, alpha, 0.5)
    shape_a = (safe * c).astype(np.float32)
    shape_b = ((1 - safe) * c).astype(np.float32)
    x = rng.standard_gamma(shape_a, dtype=np.float32)
    y = rng.standard_gamma(shape_b, dtype=np.float32)
    total = x + y
    underflow = ~(total > 0)
    total[underflow] = 1
    p = x / total
    if underflow.any():
        p[underflow] = rng.beta(safe[underflow] * c, (1 - safe[underflow]) * c)
    return np.where(interior, p, alpha)


def _proxy_signals(p: np.ndarray) -> dict[str, np.ndarray]:
    """Signals derived from p_t alone (float32). 1 - (1 - p)² is written p·(2 - p) for accuracy.

    kl is +inf where p = 0: a draft at total-variation distance 1 has no finite KL bound.
    """
    with np.errstate(divide="ignore"):
        kl = -np.log(p * (2 - p))
    entropy = -(_xlogx(p) + _xlogx(1 - p))
    return {"accept_prob": p, "kl": kl, "draft_top1": p, "draft_entropy": entropy}


def _xlogx(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    np.log(x, out=out, where=x > 0)
    return np.multiply(x, out, out=out)


def _lengths(output_tokens: np.ndarray) -> np.ndarray:
    lengths = np.asarray(output_tokens)
    if lengths.ndim != 1 or lengths.size == 0:
        raise TraceError(f"output_tokens must be a non-empty 1-D array (got shape {lengths.shape})")
    if lengths.dtype.kind not in "iu":
        raise TraceError(f"output_tokens must hold integers (got dtype {lengths.dtype})")
    if lengths.min() < 1:
        i = int(np.argmax(lengths < 1))
        raise TraceError(f"output_tokens of request index {i} is {lengths[i]}; each request "
                         "needs >= 1 output token")
    return lengths.astype(np.int64)


def _numbers(text: str, spec: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise TraceError(
            f"acceptance spec {spec!r} has a non-numeric value; use {_FORMS}"
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise TraceError(f"acceptance spec {spec!r} has a non-finite value; use {_FORMS}")
    return values
