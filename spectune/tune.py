"""The `tune` job: the best speculation policy and parameters per request rate, with a confidence
interval from the seeds, exported in the serving engines' own formats.

For each rate and policy, the policy's searchable parameters (grids and bounds declared on its
fields) are searched by successive halving (search.py), or exhaustively with `--search grid`;
every candidate that survives runs on every seed, and so does plain decoding, fixed(k=0), the
baseline. The recommendation at a rate is the lowest mean score over the seeds; its interval is
a 95% interval of that mean that never goes below zero (search.confidence_interval). A grid is a
guess at where the optimum lies: while fixed's best k sits on its top the search goes on past
it (`extend`, to a stated cap), and a best value on any other edge of the searched space gets a
note. The best fixed k per rate, with the mean batch size it ran at, becomes the
draft-length-by-batch-size table the engines take (export.py); that table is simulated at every
rate as a candidate too, so that a user sees what deploying it gives where the recommendation is
a policy no engine's config can hold (auto).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from simulator import ConfigError, SchedulerConfig
from spectune.evaluate import (
    EXECUTOR_HELP,
    METRICS,
    RAY_ADDRESS_HELP,
    Runner,
    Task,
    check_executor,
)
from spectune.export_schedule import BatchSchedule, schedule_from_points
from spectune.objectives import Objective, get_objective
from spectune.search import (
    Candidate,
    Scores,
    Steps,
    best_candidate,
    candidates,
    confidence_interval,
    edge_notes,
    exhaustive_grid,
    halving_steps,
    mean_score,
    past_the_top,
    run_together,
    seeds_steps,
)
from spectune.simulate import SimulationSpec, build_slo, note_short_trace

DEFAULT_POLICIES = "fixed,batch_adaptive,goodput,auto"
DEFAULT_RATES = (4.0, 12.0, 24.0)
BASELINE = Candidate("fixed", (("k", 0),))
#: the embedded default scenario of `spectune tune` (where it differs from `simulate`'s): the
#: shipped n-gram recording (real Spec-Bench text) drafting for Llama-3.1-8B on H100
TUNE_SCENARIO = {"draft": "none", "acceptance": "smollm2-ngram", "requests": 300}
#: those defaults as the help of tune and plan shows them
SCENARIO_SHOWN = {"draft": "none, n-gram lookup", "acceptance": TUNE_SCENARIO["acceptance"],
                  "requests": str(TUNE_SCENARIO["requests"])}


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
    executor: str = field(default="local", metadata={"help": EXECUTOR_HELP})
    ray_address: str | None = field(default=None, metadata={"help": RAY_ADDRESS_HELP})
    samples: bool = field(default=True, metadata={
        "help": "keep one whole run per rate (recommended and k=0) for the report"})

    def __post_init__(self) -> None:
        if not self.rates or not all(r > 0 and np.isfinite(r) for r in self.rates):
            raise ConfigError(f"--rates must be positive req/s, got {self.rates}")
        if len(set(self.rates)) != len(self.rates):
            given = " ".join(f"{r:g}" for r in self.rates)
            raise ConfigError(f"--rates names a rate twice ({given}): give each once")
        if self.jobs < 0:
            raise ConfigError(f"--jobs must be >= 0 (0: one worker per core), got {self.jobs}")
        check_executor(self.executor, self.ray_address)
        if self.seeds < 1 or self.points < 1:
            raise ConfigError("--seeds and --points must be >= 1")
        if self.search not in ("halving", "grid"):
            raise ConfigError(f"--search must be halving or grid, got {self.search!r}")
        self.policy_specs()  # fail on a bad --policies now

    def policy_specs(self) -> list[tuple[str, dict[str, str]]]:
        """(name, pinned params) per policy: "goodput:per_request=true" -> ("goodput", {...})."""
        from policies import policy_class, policy_names
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
    """Pinned values converted to the fields' types (through the policy's own parser); a
    structured one (a batch-size table) stays canonical JSON text, so that a candidate stays
    hashable, and the policy parses it again when it is built."""
    import json

    from policies import make_policy

    policy = make_policy(name, pinned)
    typed = {k: policy.params()[k] for k in pinned}
    return {k: json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else v
            for k, v in typed.items()}


def scheduler_for(scheduler: SchedulerConfig, c: Candidate,
                  k_max_given: bool) -> SchedulerConfig:
    """A fixed k past a k_max the user did not set runs with k_max = k: the engine's
    num_speculative_tokens is then k (the KV look-ahead grows with it); so does a pinned
    batch-size table's largest k."""
    k = c.params_dict.get("k") if c.policy == "fixed" else _table_k_max(c)
    if k is not None and k > scheduler.k_max and not k_max_given:
        return replace(scheduler, k_max=int(k))
    return scheduler


def _table_k_max(c: Candidate) -> int | None:
    """The largest k of a batch_adaptive candidate's pinned vLLM-form table, else None."""
    import json

    table = c.params_dict.get("schedule") if c.policy == "batch_adaptive" else None
    return max(int(k) for _, _, k in json.loads(table)) if isinstance(table, str) else None


class _Search:
    """The evaluations of one tune: scores per (rate, candidate), metrics per evaluation, and
    notes on what the search space left open."""

    def __init__(self, scenario, scheduler, objective: Objective, runner: Runner, seeds,
                 k_max_given: bool = True):
        self.scenario, self.scheduler, self.objective = scenario, scheduler, objective
        self.runner, self.seeds = runner, list(seeds)
        self.k_max_given = k_max_given
        self.k_limit = _replayable_k(scenario, scheduler)
        #: each evaluation's metrics, by (rate, candidate) and seed
        self.metrics: dict[tuple[float, Candidate], dict[int, dict]] = {}
        self.notes: dict[str, list[float]] = {}  # note -> the rates it applies to
        #: while searches run together (`together`): what each said, in order, and which one
        #: is taking its step
        self._said: list[list[tuple[str, float]]] | None = None
        self._saying = 0

    def note(self, text: str, rate: float) -> None:
        if self._said is not None:  # said in the searches' order once they are done
            self._said[self._saying].append((text, rate))
            return
        rates = self.notes.setdefault(text, [])
        if rate not in rates:
            rates.append(rate)

    def together(self, searches: list[tuple[float, Steps]]) -> list:
        """Run searches (each at its rate) side by side, their simulations in one batch per
        round (`run_together`): each finds what it would alone, and the notes come in the
        searches' order, as if they had run one after another. Their results, in order."""
        self._said = [[] for _ in searches]

        def evaluate(batch: list[tuple[int, list[tuple[Candidate, int]]]]) -> list[list[float]]:
            tasks = [Task(self.scenario, self.scheduler_for(c), c, searches[i][0], s)
                     for i, pairs in batch for c, s in pairs]
            results = iter(self.runner.run(tasks))
            values = []
            for i, pairs in batch:
                rate, scored = searches[i][0], []
                for c, s in pairs:
                    m = next(results)
                    self.metrics.setdefault((rate, c), {})[s] = m
                    scored.append(self.objective.score(m))
                values.append(scored)
            return values

        def started(i: int) -> None:
            self._saying = i

        try:
            return run_together([steps for _, steps in searches], evaluate, started)
        finally:
            said, self._said, self._saying = self._said, None, 0
            for notes in said:
                for text, rate in notes:
                    self.note(text, rate)

    def scheduler_for(self, c: Candidate) -> SchedulerConfig:
        """`scheduler_for`, a pinned table's k_max kept within what the acceptance can
        replay (the table's larger ks run clamped to it, as they did before k_max grew)."""
        scheduler = scheduler_for(self.scheduler, c, self.k_max_given)
        if c.policy != "fixed" and scheduler.k_max > max(self.k_limit, self.scheduler.k_max):
            return replace(scheduler, k_max=max(self.k_limit, self.scheduler.k_max))
        return scheduler

    def row(self, rate: float, c: Candidate, values: list[float]) -> dict:
        """A candidate's record at a rate: its scores over the seeds and mean metrics."""
        by_seed = self.metrics[(rate, c)]  # values[i] is seed i's (seeds run in order)
        return _row(rate, c, values, [by_seed[s] for s in self.seeds[:len(values)]],
                    self.objective, self.scheduler_for(c).k_max)

    def feasible(self, cands: list[Candidate], rate: float) -> list[Candidate]:
        """Candidates the engine would run: a fixed k above a k_max the user set is refused,
        and a combination the policy rejects (a pinned value against a grid value) is skipped
        with a note."""
        from policies import PolicyError, make_policy

        k_max = self.scheduler.k_max
        out = []
        for c in cands:
            k = c.params_dict.get("k") if c.policy == "fixed" else None
            if k is not None and (k > self.k_limit or (self.k_max_given and k > k_max)):
                continue
            try:
                make_policy(c.policy, c.params_dict)
            except PolicyError as exc:
                self.note(f"skipped {c.label}: {exc}", rate)
                continue
            out.append(c)
        return out

    def policy(self, rate: float, name: str, pinned: dict, spec: TuneSpec) -> Steps:
        """One policy's search at one rate, as steps (`spectune.search.Steps`): its scores."""
        grid = spec.search == "grid"
        cands = self.feasible(exhaustive_grid(name, pinned, spec.points) if grid
                              else candidates(name, pinned, spec.points), rate)
        if not cands:  # with what was said so far (searches before this one, and this one)
            said = ([text for notes in self._said[:self._saying + 1] for text, _ in notes]
                    if self._said is not None else [])
            raise ConfigError(f"--policies {name}: no parameter setting the policy accepts "
                              f"({'; '.join(dict.fromkeys([*self.notes, *said]))})")
        if grid:
            scores: Scores = {}
            yield from seeds_steps(scores, cands, self.seeds)
        else:
            scores = yield from halving_steps(cands, self.seeds, fixed=pinned)
        yield from self.extend(rate, pinned, scores)
        return scores

    def extend(self, rate: float, pinned: dict, scores: Scores) -> Steps:
        """While the policy's best sits on the top of a grid that declares `extend` values, try
        the next one (on every seed), up to the last (the stated hard cap)."""
        while True:
            best = best_candidate(scores, len(self.seeds))
            nxt = [c for c in self.feasible(past_the_top(best, pinned, scores), rate)
                   if c not in scores]
            if not nxt:
                return
            yield from seeds_steps(scores, nxt, self.seeds)


def _replayable_k(scenario: SimulationSpec, scheduler: SchedulerConfig) -> int:
    """The largest k the acceptance can replay: a recording's longest run (a run there means
    'at least that many'), unless its draft tree ends there; any k for a parametric model."""
    from spectune.evaluate import seeded_inputs

    acceptance = seeded_inputs(Task(scenario, scheduler, BASELINE, 1.0, 0))[2]
    max_run, tree = acceptance.meta.get("max_run"), acceptance.meta.get("tree")
    if isinstance(max_run, int) and not (tree and max_run == max(len(p) for p in tree)):
        return max(max_run, scheduler.k_max)
    return 64


def _row(rate: float, c: Candidate, values: list[float], metrics: list[dict],
         objective: Objective, k_max: int) -> dict:
    interval = confidence_interval([objective.value(v) for v in values])
    mean_metrics = {}
    for key in METRICS:
        vals = [m[key] for m in metrics if m.get(key) is not None]
        mean_metrics[key] = float(np.mean(vals)) if len(vals) == len(metrics) else None
    return {"rate": rate, "policy": c.policy, "params": c.params_dict, "label": c.label,
            "seeds": len(values), "objective": objective.value(float(np.mean(values))),
            "per_seed": [objective.value(v) for v in values],
            "ci_low": interval.low, "ci_high": interval.high, "ci_method": interval.method,
            "k_max": k_max, "metrics": mean_metrics}


def run_tune(spec: TuneSpec, scenario: SimulationSpec, scheduler: SchedulerConfig,
             out: Path | None, progress=None, k_max_given: bool = True) -> dict:
    """Search every policy at every rate; write tune.json (and samples, exports) to `out`.

    `k_max_given`: the user set the scheduler's k_max. When not, a fixed k may go past it (up to
    the `extend` cap of fixed's k), each such run with k_max raised to its k."""
    started = time.perf_counter()
    objective = get_objective(spec.objective, build_slo(scenario) is not None)
    with Runner(out / "evals" if out is not None else None, spec.jobs, progress,
                spec.executor, spec.ray_address) as runner:
        search = _Search(scenario, scheduler, objective, runner, range(spec.seeds), k_max_given)
        return _tune(spec, search, out, started)


def _best(scores: Scores) -> Candidate:
    """Lowest mean score; on a tie the simpler policy (fixed k) wins."""
    return min(scores, key=lambda c: (mean_score(scores, c), c.policy != "fixed", c))


def _tune(spec: TuneSpec, search: _Search, out: Path | None, started: float) -> dict:
    scenario, scheduler, objective = search.scenario, search.scheduler, search.objective
    runner, seeds = search.runner, search.seeds
    specs = [(name, pinned_values(name, pinned)) for name, pinned in spec.policy_specs()]
    # every policy's search at every rate, and k = 0's, side by side (`_Search.together`)
    jobs: list[tuple[float, Steps]] = []
    for rate in spec.rates:
        jobs += [(rate, search.policy(rate, name, pinned, spec)) for name, pinned in specs]
        jobs.append((rate, halving_steps([BASELINE], seeds)))
    searched: dict[float, Scores] = {rate: {} for rate in spec.rates}
    for (rate, _), scores in zip(jobs, search.together(jobs)):  # merged in the jobs' order
        searched[rate].update(scores)
    k_best: dict[float, Candidate] = {}  # the best fixed k per rate, over every seed
    for rate, scores in searched.items():
        fixed = {c: v for c, v in scores.items() if c.policy == "fixed" and len(v) == len(seeds)}
        if fixed:
            k_best[rate] = _best(fixed)
    best_fixed = [search.row(rate, c, searched[rate][c]) for rate, c in k_best.items()]
    # the table the engines' configs hold, priced as a candidate at every rate: what a user
    # who deploys the exports gets, beside policies no engine config can express (auto)
    searched_fixed = any(name == "fixed" for name, _ in specs)
    if best_fixed and not searched_fixed:  # k = 0 alone: a table of no speculation, not written
        for rate in spec.rates:
            search.note("no engine configs written: they hold a table built from the best "
                        "fixed k per rate, and --policies searched no fixed k (add fixed)", rate)
    schedule = engine_schedule(best_fixed, scheduler) if best_fixed and searched_fixed else None
    table = table_candidate(schedule, searched, len(seeds)) if schedule is not None else None
    rows, recommendations, engine_rows = [], [], []
    if table is not None:  # at every rate at once
        search.together([(rate, seeds_steps(scores, [table], seeds))
                         for rate, scores in searched.items()])
    for rate, scores in searched.items():
        full = {c: v for c, v in scores.items() if len(v) == len(seeds)}
        rate_rows = {c: search.row(rate, c, v) for c, v in scores.items()}
        rows += list(rate_rows.values())
        best = _best(full)
        recommendation = dict(rate_rows[best])
        recommendation["baseline"] = {"label": BASELINE.label,
                                      "objective": rate_rows[BASELINE]["objective"]}
        recommendations.append(recommendation)
        if table is not None:
            engine_rows.append({**rate_rows[table], "worse_than_recommended_pct": worse_pct(
                rate_rows[table]["objective"], recommendation["objective"],
                objective.direction)})
        for c in dict.fromkeys([best, *([k_best[rate]] if rate in k_best else [])]):
            for text in edge_notes(c, dict(specs).get(c.policy, {}), search):
                search.note(text, rate)
        past = [c.params_dict["k"] for c in full
                if c.policy == "fixed" and search.scheduler_for(c).k_max > scheduler.k_max]
        if past:
            search.note(f"fixed k was searched past the grid's top up to k={max(past)}, as the "
                        "best sat on the top (runs past k_max ran with k_max = k; --k-max sets "
                        "a limit)", rate)
    result = {"kind": "tune", "meta": _meta(spec, scenario, scheduler, objective, runner,
                                            started, search.k_max_given),
              "recommendations": recommendations, "best_fixed": best_fixed,
              "candidates": rows, "samples": [], "exports": {},
              "engine_table": None if table is None else {
                  "schedule": schedule.ranges(), "k_max": schedule.k_max,
                  "source": schedule.source, "label": table.label, "rates": engine_rows},
              "notes": [f"{text} (at {', '.join(f'{r:g}' for r in rates)} req/s)"
                        for text, rates in search.notes.items()]}
    if out is not None:
        if engine_rows:  # the exports' note says what the table was simulated to give
            schedule = replace(schedule, source=f"{schedule.source}; simulated, "
                               f"{objective.metric}: " + ", ".join(
                                   f"{figure(r['objective'], objective.unit)} at {r['rate']:g} "
                                   f"req/s ({against(r['worse_than_recommended_pct'])})"
                                   for r in engine_rows))
        _write_extras(result, spec, scenario, scheduler, recommendations, schedule, out,
                      runner)
        result["meta"]["wall_s"] = time.perf_counter() - started
        from spectune.files import write_json

        write_json(out / "tune.json", result)
    return result


def engine_schedule(best_fixed: list[dict], scheduler: SchedulerConfig) -> BatchSchedule:
    """The draft length by batch size table of the engines' configs: the best fixed k at each
    rate, placed at the mean batch size it ran at (export_schedule.schedule_from_points). Its
    k_max (the engines' num_speculative_tokens) is the table's largest k, or the scheduler's:
    the k_max the table is simulated with (`scheduler_for`)."""
    points = [(r["metrics"]["mean_batch_size"] or 1.0, int(r["params"]["k"]))
              for r in best_fixed]
    schedule = schedule_from_points(
        points, k_max=max(scheduler.k_max, *(k for _, k in points)),
        max_batch=scheduler.max_num_seqs,
        source="spectune tune: the best fixed k at each rate, placed at the mean batch "
               f"size it ran at ({', '.join(f'{b:.1f}->{k}' for b, k in points)})")
    return replace(schedule, k_max=max(scheduler.k_max, *(k for _, k in schedule.steps)))


def table_candidate(schedule: BatchSchedule, searched: dict[float, Scores],
                    seeds: int) -> Candidate:
    """`batch_adaptive` pinned to the table, as a user would pin it (the same cache entries).
    A table of one k is that fixed k where the search ran it on every seed at every rate (it
    steps as the fixed k does); elsewhere the table is its own candidate, so that no fixed k
    is completed on seeds the search dropped it from."""
    import json

    if len(schedule.steps) == 1:
        fixed = Candidate("fixed", (("k", schedule.steps[0][1]),))
        if all(len(scores.get(fixed, ())) == seeds for scores in searched.values()):
            return fixed
    text = json.dumps(schedule.ranges(), separators=(",", ":"))
    return Candidate("batch_adaptive", tuple(pinned_values("batch_adaptive",
                                                           {"schedule": text}).items()))


def worse_pct(value: float, best: float, direction: str) -> float | None:
    """How much worse `value` is than `best`, in percent of it (negative: better), for an
    objective to minimise or maximise; None where no ratio means anything (a zero or
    unbounded best, as goodput under an SLO no request met)."""
    if not (best and np.isfinite(best) and np.isfinite(value)):
        return None
    return (value / best - 1) * 100 if direction == "min" else (1 - value / best) * 100


def figure(value: float, unit: str) -> str:
    """A value with four significant digits and its unit, without exponents."""
    text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{text} {unit}" if unit else text


def against(worse: float | None) -> str:
    """`worse_pct` as words: "+1.2% against the recommendation", or why there is no figure."""
    if worse is None:
        return "no ratio to the recommendation's zero or unbounded value"
    return f"{abs(worse):.1f}% {'worse' if worse > 0 else 'better'} than the recommendation"


def _meta(spec, scenario, scheduler, objective, runner, started, k_max_given: bool) -> dict:
    from spectune.evaluate import seeded_inputs

    workload, latency, acceptance, kv, slo = seeded_inputs(
        Task(scenario, scheduler, BASELINE, spec.rates[0], 0))
    acc = acceptance.meta
    note_short_trace(scenario, workload, per_seed=True)
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
            "k_max_given": k_max_given,
            "scenario": scenario.as_record(),
            "simulations": runner.total, "reused_from_cache": runner.cached,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - started}


def _write_extras(result, spec, scenario, scheduler, recommendations, schedule, out: Path,
                  runner: Runner):
    """Sample runs for the report, and the engines' configs of the table (`engine_schedule`)."""
    from spectune.samples import slug, write_sample

    if spec.samples:  # simulated over the runner's workers, written where they run: here
        tasks, folders = [], []
        for rec in recommendations:
            for c in dict.fromkeys([Candidate(rec["policy"], tuple(sorted(rec["params"].items()))),
                                    BASELINE]):
                folders.append(out / "samples" / f"rate{rec['rate']:g}" / slug(c.label))
                k_max = rec.get("k_max", scheduler.k_max) if c != BASELINE else scheduler.k_max
                tasks.append(Task(scenario, replace(scheduler, k_max=k_max), c, rec["rate"], 0))
        for task, paths in zip(tasks, runner.map_here(write_sample, tasks, folders)):
            result["samples"].append({"rate": task.rate, "label": task.candidate.label, **{
                k: str(Path(v).relative_to(out)) for k, v in paths.items()}})
    if schedule is not None:
        from spectune.export import scenario_drafter

        result["exports"], result["export_problems"] = _export_each(
            out / "exports", schedule, scenario_drafter(scenario, scheduler))


def _export_each(folder: Path, schedule, drafter) -> tuple[dict[str, str], dict[str, str]]:
    """Every engine that can express the schedule with the tuned drafter gets its config,
    naming that drafter; the others say why not (TensorRT-LLM needs the largest draft length
    at batch size 1; SGLang switches steps by batch size for EAGLE only)."""
    from spectune.export import EXPORTERS, ExportError, write_exports

    written, problems = {}, {}
    for engine in EXPORTERS:
        try:
            for name, file in write_exports(folder, schedule, drafter, engines=[engine]).items():
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
