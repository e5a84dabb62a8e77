"""What the tuner and the planner optimise: a registry of objectives over the flat metrics.

Every objective is turned into a score where lower is better (a maximised metric is negated), so
the search code never needs to know the direction; reports show the metric itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator import ConfigError


@dataclass(frozen=True)
class Objective:
    name: str
    metric: str  # a key of evaluate.METRICS
    direction: str  # "min" or "max"
    needs_slo: bool
    help: str

    def score(self, metrics: dict) -> float:
        """Lower is better; a missing value (no request finished, no SLO) scores worst."""
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            return math.inf
        return value if self.direction == "min" else -value

    def value(self, score: float) -> float:
        """The metric back from a score (for tables and reports)."""
        return score if self.direction == "min" else -score

    @property
    def unit(self) -> str:
        return "tok/s" if self.metric.endswith("_per_s") else "s"


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("mean-e2e", "e2e_mean_s", "min", False, "mean end-to-end latency"),
    Objective("p99-e2e", "e2e_p99_s", "min", False, "99th-percentile end-to-end latency"),
    Objective("p99-tpot", "tpot_p99_s", "min", False, "99th-percentile time per output token"),
    Objective("goodput-under-slo", "goodput_tokens_per_s", "max", True,
              "tokens/s of requests that met the TTFT/TPOT SLOs (needs --slo-ttft/--slo-tpot)"),
)}


def get_objective(name: str, has_slo: bool) -> Objective:
    try:
        objective = OBJECTIVES[name]
    except KeyError:
        raise ConfigError(f"unknown objective {name!r}; use one of "
                          f"{', '.join(OBJECTIVES)}") from None
    if objective.needs_slo and not has_slo:
        raise ConfigError(f"objective {name} needs an SLO: give --slo-ttft and/or --slo-tpot")
    return objective
