"""The `tune` job: the best speculation policy and parameters per request rate, with a confidence
interval from the seeds, exported in the serving engines' own formats.

For each rate and policy, the policy's searchable parameters (grids and bounds declared on its
fields) are searched by successive halving (search.py), or exhaustively with `--search grid`;
every candidate that survives runs on every seed, and so does plain decoding, fixed(k=0), the
baseline. The recommendation at a rate is the lowest mean score over the seeds; its interval is
the Student-t 95% interval of that mean. The best fixed k per rate, with the mean batch size it
ran at, becomes the draft-length-by-batch-size table the engines take (export.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from policies import policy_class, policy_names
from simulator import ConfigError, SchedulerConfig
from spectune.evaluate import METRICS, Runner, Task, slo_of
from spectune.objectives import Objective, get_objective
from spectune.search import (
    Candidate,
    Scores,
    candidates,
    confidence_interval,
    exhaustive_grid,
    mean_score,
    successive_halving,
)
from spectune.simulate import SimulationSpec

DEFAULT_POLICIES = "fixed,batch_adaptive,goodput"
DEFAULT_RATES = (4.0, 12.0, 24.0)
BASELINE = Candidate("fixed", (("k", 0),))
#: the embedded default scenario of `spectune tune` (where it differs from `simulate`'s): the
#: shipped n-gram recording (real Spec-Bench text) drafting for Llama-3.1-8B on H100
TUNE_SCENARIO = {"draft": "none", "acceptance": "smollm2-ngram", "requests": 300}


@dataclass(frozen=True)
class TuneSpec:
    """How to tune. The CLI's flags are these fields (the scenario's come from SimulationSpec)."""

    rates: tuple[float, ...] = DEFAULT_RATES
    policies: str = field(default=DEFAULT_POLICIES, metadata={
        "help": "comma-separated NAME[:KEY=VALUE...]; KEY=VALUE pins a parameter"})
    objective: str = field(default="mean-e2e", metadata={
        "help": "mean-e2e, p99-e2e, p99-tpot or goodput-under-slo"})
    seeds: int = field(default=3, metadata={"help": "replicates per candidate (trace windows)"})
    search: str = field(default="halving", metadata={
        "help": "halving (successive halving, then a local refinement) or grid (exhaustive)"})
    points: int = field(default=4, metadata={
        "help": "Sobol points over each policy's continuous parameters (grid: per parameter)"})
    jobs: int = field(default=0, metadata={"help": "worker processes (0: one per core)"})
    samples: bool = field(default=True, metadata={
        "help": "keep one whole run per rate (recommended and k=0) for the report"})

    def __post_init__(self) -> None:
        if not self.rates or not all(r > 0 and np.isfinite(r) for r in self.rates):
            raise ConfigError(f"--rates must be positive req/s, got {self.rates}")
        if self.seeds < 1 or self.points < 1:
            raise ConfigError("--seeds and --points must be >= 1")
        if self.search not in ("halving", "grid"):
            raise ConfigError(f"--search must be halving or grid, got {self.search!r}")
        self.policy_specs()  # fail on a bad --policies now

    def policy_specs(self) -> list[tuple[str, dict[str, str]]]:
        """(name, pinned params) per policy: "goodput:per_request=true" -> ("goodput", {...})."""
        from spectune.flags import parse_policy_list

        out = []
        try:
            items = parse_policy_list(self.policies)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for _, name, pinned in items:
            if name not in policy_names():
                raise ConfigError(f"--policies: unknown policy {name!r}; known: "
                                  f"{', '.join(policy_names())}")
            if policy_class(name).simulation_only:
                raise ConfigError(f"--policies: {name} knows the future (simulation only): it "
                                  "is a bound to compare with, not a policy to deploy")
            out.append((name, pinned))
        if not out:
            raise ConfigError("--policies: no policy given")
        return out


def pinned_values(name: str, pinned: dict[str, str]) -> dict:
    """Pinned values converted to the fields' types (through the policy's own parser)."""
    from policies import make_policy

    policy = make_policy(name, pinned)
    return {k: policy.params()[k] for k in pinned}


class _Search:
    """The evaluations of one tune: scores per (rate, candidate), metrics per evaluation."""

    def __init__(self, scenario, scheduler, objective: Objective, runner: Runner, seeds):
        self.scenario, self.scheduler, self.objective = scenario, scheduler, objective
        self.runner, self.seeds = runner, list(seeds)
        self.metrics: dict[tuple[float, Candidate], list[dict]] = {}

    def evaluator(self, rate: float):
        def evaluate(pairs: list[tuple[Candidate, int]]) -> list[float]:
            tasks = [Task(self.scenario, self.scheduler, c, rate, s) for c, s in pairs]
            results = self.runner.run(tasks)
            for (c, _), m in zip(pairs, results):
                self.metrics.setdefault((rate, c), []).append(m)
            return [self.objective.score(m) for m in results]
        return evaluate

    def feasible(self, cands: list[Candidate]) -> list[Candidate]:
        """A fixed k above the engine's k_max is refused by the engine: not a candidate."""
        k_max = self.scheduler.k_max
        return [c for c in cands if not (c.policy == "fixed" and c.params_dict["k"] > k_max)]

    def policy(self, rate: float, name: str, pinned: dict, spec: TuneSpec) -> Scores:
        evaluate = self.evaluator(rate)
        if spec.search == "grid":
            cands = self.feasible(exhaustive_grid(name, pinned, spec.points))
            scores: Scores = {}
            for c, v in zip(cands, _chunks(evaluate([(c, s) for c in cands for s in self.seeds]),
                                          len(self.seeds))):
                scores[c] = v
            return scores
        cands = self.feasible(candidates(name, pinned, spec.points))
        return successive_halving(cands, self.seeds, evaluate, fixed=pinned)


def _chunks(values: list[float], n: int) -> list[list[float]]:
    return [values[i : i + n] for i in range(0, len(values), n)]


def _row(rate: float, c: Candidate, values: list[float], metrics: list[dict],
         objective: Objective) -> dict:
    low, high = confidence_interval([objective.value(v) for v in values])
    mean_metrics = {}
    for key in METRICS:
        vals = [m[key] for m in metrics if m.get(key) is not None]
        mean_metrics[key] = float(np.mean(vals)) if len(vals) == len(metrics) else None
    return {"rate": rate, "policy": c.policy, "params": c.params_dict, "label": c.label,
            "seeds": len(values), "objective": objective.value(float(np.mean(values))),
            "ci_low": min(low, high), "ci_high": max(low, high), "metrics": mean_metrics}


def run_tune(spec: TuneSpec, scenario: SimulationSpec, scheduler: SchedulerConfig,
             out: Path | None, progress=None) -> dict:
    """Search every policy at every rate; write tune.json (and samples, exports) to `out`."""
    started = time.perf_counter()
    objective = get_objective(spec.objective, slo_of(scenario) is not None)
    with Runner(out / "evals" if out is not None else None, spec.jobs, progress) as runner:
        return _tune(spec, scenario, scheduler, objective, runner, out, started)


def _best(scores: Scores) -> Candidate:
    """Lowest mean score; on a tie the simpler policy (fixed k) wins."""
    return min(scores, key=lambda c: (mean_score(scores, c), c.policy != "fixed", c))


def _tune(spec, scenario, scheduler, objective, runner, out, started) -> dict:
    seeds = list(range(spec.seeds))
    search = _Search(scenario, scheduler, objective, runner, seeds)
    specs = [(name, pinned_values(name, pinned)) for name, pinned in spec.policy_specs()]
    rows, recommendations, best_fixed = [], [], []
    for rate in spec.rates:
        scores: Scores = {}
        for name, pinned in specs:
            scores.update(search.policy(rate, name, pinned, spec))
        scores.update(successive_halving([BASELINE], seeds, search.evaluator(rate)))
        full = {c: v for c, v in scores.items() if len(v) == len(seeds)}
        rate_rows = {c: _row(rate, c, v, search.metrics[(rate, c)][-len(v):], objective)
                     for c, v in scores.items()}
        rows += list(rate_rows.values())
        best = _best(full)
        recommendation = dict(rate_rows[best])
        recommendation["baseline"] = {"label": BASELINE.label,
                                      "objective": rate_rows[BASELINE]["objective"]}
        recommendations.append(recommendation)
        fixed = [c for c in full if c.policy == "fixed"]
        if fixed:
            k_best = _best({c: full[c] for c in fixed})
            best_fixed.append(rate_rows[k_best])
    result = {"kind": "tune", "meta": _meta(spec, scenario, scheduler, objective, runner,
                                            started),
              "recommendations": recommendations, "best_fixed": best_fixed,
              "candidates": rows, "samples": [], "exports": {}}
    if out is not None:
        _write_extras(result, spec, scenario, scheduler, recommendations, best_fixed, out)
        result["meta"]["wall_s"] = time.perf_counter() - started
        from spectune.files import write_json

        write_json(out / "tune.json", result)
    return result


def _meta(spec, scenario, scheduler, objective, runner, started) -> dict:
    from spectune.evaluate import seeded_inputs

    workload, latency, acceptance, kv, slo = seeded_inputs(
        Task(scenario, scheduler, BASELINE, spec.rates[0], 0))
    acc = acceptance.meta
    return {"workload": workload.source.rsplit(", requests", 1)[0]
            + f", {len(workload)} requests per seed (seed i: the i-th window), rescaled to "
              "each rate",
            "latency_model": latency.source,
            "acceptance": acc.get("description") or
            f"recorded: {acc.get('drafter', '?')} drafting for {acc.get('target', '?')}",
            "kv_capacity_tokens": kv, "scheduler": asdict(scheduler),
            "objective": objective.name, "objective_metric": objective.metric,
            "direction": objective.direction, "unit": objective.unit,
            "slo": {k: v for k, v in (asdict(slo) if slo else {}).items() if v is not None},
            "seeds": list(range(spec.seeds)), "rates": list(spec.rates), "spec": asdict(spec),
            "scenario": asdict(scenario),
            "simulations": runner.total, "reused_from_cache": runner.cached,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - started}


def _write_extras(result, spec, scenario, scheduler, recommendations, best_fixed, out: Path):
    """Sample runs for the report, and the engines' configs from the best fixed k per rate."""
    from spectune.samples import slug, write_sample

    if spec.samples:
        for rec in recommendations:
            for c in dict.fromkeys([Candidate(rec["policy"], tuple(sorted(rec["params"].items()))),
                                    BASELINE]):
                folder = out / "samples" / f"rate{rec['rate']:g}" / slug(c.label)
                paths = write_sample(Task(scenario, scheduler, c, rec["rate"], 0), folder)
                result["samples"].append({"rate": rec["rate"], "label": c.label, **{
                    k: str(Path(v).relative_to(out)) for k, v in paths.items()}})
    if best_fixed:
        from spectune.export import schedule_from_points

        points = [(r["metrics"]["mean_batch_size"] or 1.0, int(r["params"]["k"]))
                  for r in best_fixed]
        schedule = schedule_from_points(
            points, k_max=scheduler.k_max, max_batch=scheduler.max_num_seqs,
            source="spectune tune: the best fixed k at each rate, placed at the mean batch "
                   f"size it ran at ({', '.join(f'{b:.1f}->{k}' for b, k in points)})")
        result["exports"], result["export_problems"] = _export_each(out / "exports", schedule)


def _export_each(folder: Path, schedule) -> tuple[dict[str, str], dict[str, str]]:
    """Every engine that can express the schedule gets its config; the others say why not
    (TensorRT-LLM, e.g., needs the largest draft length at batch size 1)."""
    from spectune.export import EXPORTERS, ExportError, write_exports

    written, problems = {}, {}
    for engine in EXPORTERS:
        try:
            for name, file in write_exports(folder, schedule, engines=[engine]).items():
                written[name] = f"exports/{file}"
        except ExportError as exc:
            problems[engine] = str(exc)
    return written, problems


def replace_scenario_defaults(scenario: SimulationSpec, given: set[str]) -> SimulationSpec:
    """The tune scenario: simulate's fields, with TUNE_SCENARIO where the user gave nothing
    (and no --profile, which brings its own models)."""
    changes = {k: v for k, v in TUNE_SCENARIO.items() if k not in given}
    if scenario.profile is not None:
        changes.pop("draft", None)
    return replace(scenario, **changes)
