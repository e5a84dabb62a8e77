"""Synthetic workloads (Poisson / gamma arrivals with sampled lengths) and rate rescaling.

Used for load sweeps: real traces have one fixed rate, but a tuner must be judged across loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from traces._checks import count, positive_finite
from traces.builtin import builtin_names, builtin_workload
from traces.errors import TraceError
from traces.loaders import load_workload
from traces.workload import Workload

_LENGTH_FORMS = (
    "a built-in workload name ({names}), 'fixed:PROMPT,OUTPUT', "
    "'lognormal:PROMPT_MEAN,OUTPUT_MEAN,SIGMA', or the path of a workload file"
)


def poisson_arrivals(rate_per_s: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of `n` requests from a Poisson process with the given rate.

    The first request arrives at t = 0 and the remaining n - 1 follow exponential gaps, so the
    n arrivals span exactly n - 1 gaps — the same count Workload.mean_rate_per_s divides by.
    """
    rate = positive_finite("rate_per_s", rate_per_s)
    n = count("n", n)
    _check_rng(rng)
    gaps = rng.exponential(1.0 / rate, size=n - 1)
    return _from_gaps(gaps)


def gamma_arrivals(rate_per_s: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) with gamma inter-arrival gaps: mean 1/rate, coefficient of variation cv.

    shape = 1/cv², scale = 1/(rate·shape). cv = 1 is a Poisson process; cv > 1 is burstier,
    cv < 1 more regular. As in poisson_arrivals, the first request arrives at t = 0.
    """
    rate = positive_finite("rate_per_s", rate_per_s)
    cv = positive_finite("cv", cv)
    n = count("n", n)
    _check_rng(rng)
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return _from_gaps(gaps)


@runtime_checkable
class LengthSampler(Protocol):
    """Draws (prompt_tokens, output_tokens) for n requests; both int64 arrays, values >= 1."""

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True, eq=False)
class EmpiricalLengths:
    """Resample (prompt, output) PAIRS from a trace, keeping their joint distribution.

    Sampling the two columns independently would destroy their correlation (long prompts with
    short answers in code completion, for instance), which matters for batching and KV memory.
    """

    workload: Workload

    def __post_init__(self) -> None:
        if not isinstance(self.workload, Workload):
            raise TraceError(
                f"EmpiricalLengths needs a Workload (got {type(self.workload).__name__}); "
                "load one with load_workload or builtin_workload"
            )

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        n = count("n", n)
        rows = rng.integers(0, len(self.workload), size=n)
        return self.workload.prompt_tokens[rows], self.workload.output_tokens[rows]

    def describe(self) -> str:
        return f"(prompt, output) pairs resampled from {self.workload.source}"


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same prompt and output length (isolates arrival effects)."""

    prompt: int
    output: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", count("FixedLengths prompt tokens", self.prompt))
        object.__setattr__(self, "output", count("FixedLengths output tokens", self.output))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        n = count("n", n)
        return np.full(n, self.prompt, dtype=np.int64), np.full(n, self.output, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed {self.prompt} prompt / {self.output} output tokens"


@dataclass(frozen=True)
class LognormalLengths:
    """Independent log-normal prompt and output lengths with the given means.

    A smooth heavy-tailed stand-in when no trace fits. Samples are rounded and clipped to >= 1,
    which raises the realised mean slightly above the nominal one when means are small.
    """

    prompt_mean: float
    output_mean: float
    sigma: float

    def __post_init__(self) -> None:
        positive_finite("LognormalLengths prompt_mean", self.prompt_mean)
        positive_finite("LognormalLengths output_mean", self.output_mean)
        positive_finite("LognormalLengths sigma", self.sigma)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        n = count("n", n)
        # mean of lognormal(mu, sigma) is exp(mu + sigma²/2): solve for mu.
        mu = np.log([self.prompt_mean, self.output_mean]) - self.sigma**2 / 2
        draws = rng.lognormal(mu[:, None], self.sigma, size=(2, n))
        lengths = np.maximum(np.rint(draws), 1).astype(np.int64)
        return lengths[0], lengths[1]

    def describe(self) -> str:
        return (f"log-normal lengths (prompt mean {self.prompt_mean:g}, output mean "
                f"{self.output_mean:g}, sigma {self.sigma:g})")


def parse_lengths(spec: str) -> LengthSampler:
    """Turn a CLI length spec into a sampler; see _LENGTH_FORMS for the accepted strings."""
    if not isinstance(spec, str):
        raise TraceError(f"length spec must be a string (got {type(spec).__name__})")
    text = spec.strip()
    forms = _LENGTH_FORMS.format(names=", ".join(builtin_names()))
    if text in builtin_names():
        return EmpiricalLengths(builtin_workload(text))
    kind, colon, rest = text.partition(":")
    if colon and kind in ("fixed", "lognormal"):
        values = _floats(rest, spec, forms)
        if kind == "fixed" and len(values) == 2 and all(v.is_integer() for v in values):
            return FixedLengths(int(values[0]), int(values[1]))
        if kind == "lognormal" and len(values) == 3:
            return LognormalLengths(*values)
        raise TraceError(f"bad length spec {spec!r}; use {forms}")
    if text and Path(text).exists():
        return EmpiricalLengths(load_workload(text))
    raise TraceError(f"unknown length spec {spec!r} (not a known name or an existing file); "
                     f"use {forms}")


def synthetic_workload(
    kind: Literal["poisson", "gamma"],
    rate_per_s: float,
    n: int,
    lengths: LengthSampler | str,
    rng: np.random.Generator,
    cv: float = 1.0,
) -> Workload:
    """A workload of `n` synthetic arrivals with lengths drawn from `lengths`.

    Arrivals are drawn before lengths, so a fixed seed reproduces the whole workload. `cv` only
    applies to gamma arrivals (Poisson is cv = 1 by definition).
    """
    sampler = parse_lengths(lengths) if isinstance(lengths, str) else lengths
    if not isinstance(sampler, LengthSampler):
        raise TraceError(f"lengths must be a LengthSampler or a spec string "
                         f"(got {type(lengths).__name__})")
    if kind == "poisson":
        if cv != 1.0:
            raise TraceError(f"cv={cv!r} given for Poisson arrivals; use kind='gamma' for cv != 1")
        arrival = poisson_arrivals(rate_per_s, n, rng)
        shape = f"Poisson arrivals at {float(rate_per_s):g} req/s"
    elif kind == "gamma":
        arrival = gamma_arrivals(rate_per_s, cv, n, rng)
        shape = f"gamma arrivals at {float(rate_per_s):g} req/s (cv {float(cv):g})"
    else:
        raise TraceError(f"unknown arrival kind {kind!r}; use 'poisson' or 'gamma'")
    prompt, output = sampler.sample(len(arrival), rng)
    describe = getattr(sampler, "describe", None)
    what = describe() if callable(describe) else type(sampler).__name__
    return Workload(
        arrival_s=arrival,
        prompt_tokens=prompt,
        output_tokens=output,
        request_ids=np.arange(len(arrival), dtype=np.int64),
        source=f"synthetic: {len(arrival)} requests, {shape}; lengths: {what}",
    )


def rescale_to_rate(workload: Workload, rate_per_s: float) -> Workload:
    """Stretch or compress all inter-arrival gaps by one factor so the mean rate hits the target.

    Scaling every gap equally keeps the trace's burstiness (its gap distribution up to scale)
    while changing the load. The first arrival time is kept; lengths are untouched.
    """
    target = positive_finite("rate_per_s", rate_per_s)
    current = workload.mean_rate_per_s
    if len(workload) < 2 or math.isinf(current):
        raise TraceError(
            f"cannot rescale {workload.source!r}: its mean rate is {current} (needs at least two "
            "requests at different times)"
        )
    factor = current / target
    start = workload.arrival_s[0]
    arrival = start + (workload.arrival_s - start) * factor
    return Workload(
        arrival_s=arrival,
        prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens,
        request_ids=workload.request_ids,
        source=(f"{workload.source}, rescaled from {current:.4g} to {target:.4g} req/s "
                f"(gaps x{factor:.4g})"),
        prompts=workload.prompts,
        categories=workload.categories,
    )


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    arrival = np.empty(gaps.size + 1, dtype=np.float64)
    arrival[0] = 0.0
    np.cumsum(gaps, out=arrival[1:])
    return arrival


def _floats(text: str, spec: str, forms: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise TraceError(f"bad length spec {spec!r}: non-numeric value; use {forms}") from None
    if not all(math.isfinite(v) for v in values):
        raise TraceError(f"bad length spec {spec!r}: values must be finite; use {forms}")
    return values


def _check_rng(rng: object) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (got {type(rng).__name__}); "
                        "use numpy.random.default_rng(seed)")
