"""What a profile sweeps: batch sizes, tokens per request and context lengths, per phase."""

from __future__ import annotations

from dataclasses import dataclass, field


def _axis(name: str, values: tuple[int, ...], minimum: int) -> tuple[int, ...]:
    if not values:
        raise ValueError(f"grid axis {name} is empty; give at least one value")
    bad = [v for v in values if not isinstance(v, int) or v < minimum]
    if bad:
        raise ValueError(f"grid axis {name} has {bad}: every value must be an integer >= {minimum}")
    return tuple(sorted(set(values)))


@dataclass(frozen=True)
class Grid:
    """Axes of the sweep. Decode is query 1; verify is every other query length (k + 1)."""

    batch_sizes: tuple[int, ...] = field(default=(1, 2, 4, 8, 16), metadata={
        "help": "requests per decode/verify/draft pass"})
    query_tokens: tuple[int, ...] = field(default=(1, 2, 3, 5, 9), metadata={
        "help": "tokens per request in a decode (1) or verify (k+1) pass, and in a draft "
                "chain's first pass (its catch-up)"})
    context_tokens: tuple[int, ...] = field(default=(64, 256, 512, 1024), metadata={
        "help": "tokens already cached per request"})
    prompt_tokens: tuple[int, ...] = field(default=(16, 64, 256, 512), metadata={
        "help": "prompt length of a prefill pass"})
    prefill_batch_sizes: tuple[int, ...] = field(default=(1, 2, 4), metadata={
        "help": "requests per prefill pass"})

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "query_tokens", "prompt_tokens", "prefill_batch_sizes"):
            object.__setattr__(self, name, _axis(name, tuple(getattr(self, name)), 1))
        object.__setattr__(self, "context_tokens",
                           _axis("context_tokens", tuple(self.context_tokens), 1))

    def as_dict(self) -> dict[str, list[int]]:
        return {name: list(getattr(self, name)) for name in self.__dataclass_fields__}


#: small enough for CI (well under two minutes on one CPU core), big enough to interpolate inside
QUICK_GRID = Grid(batch_sizes=(1, 2, 4), query_tokens=(1, 2, 3, 5), context_tokens=(32, 64, 128),
                  prompt_tokens=(16, 32, 64), prefill_batch_sizes=(1, 2))
DEFAULT_GRID = Grid()


@dataclass(frozen=True)
class Point:
    """One measured pass: `num_seqs` requests, each feeding `query` tokens after `cached`."""

    role: str
    phase: str
    num_seqs: int
    query: int
    cached: int

    @property
    def key(self) -> tuple:
        return (self.role, self.phase, self.num_seqs, self.query, self.cached)


def points(grid: Grid, with_draft: bool) -> list[Point]:
    """Every pass the sweep times, target first."""
    out = [Point("target", "prefill", b, p, 0)
           for b in grid.prefill_batch_sizes for p in grid.prompt_tokens]
    out += [Point("target", "decode" if q == 1 else "verify", b, q, c)
            for b in grid.batch_sizes for q in grid.query_tokens for c in grid.context_tokens]
    if with_draft:
        out += [Point("draft", "prefill", b, p, 0)
                for b in grid.prefill_batch_sizes for p in grid.prompt_tokens]
        out += [Point("draft", "draft" if q == 1 else "catchup", b, q, c)
                for b in grid.batch_sizes for q in grid.query_tokens for c in grid.context_tokens]
    return out
