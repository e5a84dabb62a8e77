"""The `plan` job: capacity planning. For each policy and hardware option, the highest request
rate one replica sustains with the SLOs met for `attainment` of the requests, and how many
replicas a target rate needs (and what they cost per hour, given a price per GPU-hour).

With `tp_options`, a hardware option is a shape: a GPU and a tensor-parallel degree (a replica
of N GPUs, docs/tensor-parallel.md). Every shape the model fits is planned like a GPU (GPUs
needed = replicas x N, cost = GPUs x price), the others are skipped with the reason, and the
shape with the fewest GPUs (or the lowest cost, given prices) is each policy's choice; each
shape's best policy, and the shape that with it serves the target cheapest, is the plan's.

The maximum rate is bracketed by doubling from 1 req/s, then bisected to `tolerance` (relative)
with in-process simulations (every probe cached like tune's). All (policy, hardware) pairs move in
lockstep, so each round's probes run in parallel. The result is checked, not assumed: the plan
records the attainment simulated at 0.95x and 1.05x of every maximum (met, then missed; the
report shows both). Replicas = ceil(target / max per replica) assumes the router spreads load
evenly (`spectune simulate --replicas N --router least-loaded` checks a specific N).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from simulator import ConfigError, SchedulerConfig, get_gpu
from simulator.tensor_parallel import TP_DEGREES
from spectune.console import seconds
from spectune.evaluate import (
    EXECUTOR_HELP,
    RAY_ADDRESS_HELP,
    Runner,
    Task,
    check_executor,
    seeded_inputs,
)
from spectune.search import Candidate
from spectune.simulate import SimulationSpec, build_latency, build_slo, note_short_trace

MAX_RATE = 4096.0
MIN_RATE = 0.01  # below this a replica serves nothing useful: reported as no capacity


@dataclass(frozen=True)
class PlanSpec:
    policies: str = field(default="fixed:k=0,fixed:k=4,goodput", metadata={
        "help": "comma-separated NAME[:KEY=VALUE...]"})
    hardware_options: str = field(default="H100-SXM,A100-80GB", metadata={
        "help": "GPUs to compare (roofline), comma-separated; ignored with --profile"})
    attainment: float = field(default=0.99, metadata={
        "help": "share of requests that must meet the SLOs"})
    target_rate: float | None = field(default=None, metadata={
        "help": "request rate to plan replicas for (req/s)"})
    prices: str | None = field(default=None, metadata={
        "help": "price per GPU-hour per hardware, e.g. H100-SXM=3.5,A100-80GB=2.0"})
    tp_options: str | None = field(default=None, metadata={
        "help": "tensor-parallel degrees to compare on each hardware option, comma-separated "
                "(e.g. 1,2,4,8): replicas of N GPUs, GPUs needed = replicas x N; a shape the "
                "model does not fit is skipped with the reason", "unset": "--tp alone"})
    tolerance: float = field(default=0.02, metadata={"help": "relative precision of the rate"})
    jobs: int = field(default=0, metadata={"help": "worker processes (0: one per core)"})
    executor: str = field(default="local", metadata={"help": EXECUTOR_HELP})
    ray_address: str | None = field(default=None, metadata={"help": RAY_ADDRESS_HELP})

    def __post_init__(self) -> None:
        if self.jobs < 0:
            raise ConfigError(f"--jobs must be >= 0 (0: one worker per core), got {self.jobs}")
        check_executor(self.executor, self.ray_address)
        if not 0 < self.attainment <= 1:
            raise ConfigError(f"--attainment must be in (0, 1], got {self.attainment}")
        if self.target_rate is not None and not self.target_rate > 0:
            raise ConfigError(f"--target-rate must be > 0, got {self.target_rate}")
        if not 0 < self.tolerance < 0.5:
            raise ConfigError(f"--tolerance must be in (0, 0.5), got {self.tolerance}")
        for name in self.hardware_list():
            get_gpu(name)  # unknown hardware: the catalog's error names the known ones
        for name in self.price_map():
            if name not in self.hardware_list():
                raise ConfigError(f"--prices: {name!r} is not among --hardware-options "
                                  f"({self.hardware_options}); price the hardware you compare")
        self.tp_list(1)  # a clear error for a malformed --tp-options

    def hardware_list(self) -> list[str]:
        return [h.strip() for h in self.hardware_options.split(",") if h.strip()]

    def tp_list(self, tp: int) -> list[int]:
        """The tensor-parallel degrees to plan: --tp-options, else the scenario's --tp."""
        if self.tp_options is None:
            return [tp]
        out = []
        for item in (t.strip() for t in self.tp_options.split(",")):
            if not item.isdigit() or int(item) not in TP_DEGREES or int(item) in out:
                raise ConfigError(f"--tp-options: {item!r}: give distinct degrees among "
                                  f"{', '.join(map(str, TP_DEGREES))}, e.g. 1,2,4,8")
            out.append(int(item))
        return out

    def as_record(self) -> dict:
        """The spec as plan.json records it: --tp-options only where given."""
        record = asdict(self)
        if record["tp_options"] is None:
            del record["tp_options"]
        return record

    def price_map(self) -> dict[str, float]:
        out = {}
        for item in (p.strip() for p in (self.prices or "").split(",") if p.strip()):
            name, sep, value = item.partition("=")
            try:
                out[name.strip()] = float(value)
            except ValueError:
                sep = ""
            if not sep or out.get(name.strip(), -1) < 0:
                raise ConfigError(f"--prices: {item!r}: write HARDWARE=PRICE_PER_HOUR")
        return out


@dataclass
class _Bracket:
    """One (policy, hardware, TP degree) search: `lo` met the SLOs, `hi` did not (None: not
    found yet)."""

    candidate: Candidate
    hardware: str | None
    tp: int = 1
    lo: float = 0.0
    hi: float | None = None

    def probe(self) -> float:
        return max(2 * self.lo, 1.0) if self.hi is None else (self.lo + self.hi) / 2

    def done(self, tolerance: float) -> bool:
        if self.lo >= MAX_RATE:
            return True
        if self.hi is None:
            return False
        return self.hi - self.lo <= tolerance * self.lo or self.hi < MIN_RATE


def _candidates(text: str) -> list[Candidate]:
    from spectune.tune import TuneSpec, pinned_values

    specs = TuneSpec(policies=text).policy_specs()
    return [Candidate(n, tuple(sorted(pinned_values(n, p).items()))) for n, p in specs]


def run_plan(spec: PlanSpec, scenario: SimulationSpec, scheduler: SchedulerConfig,
             out: Path | None, progress=None, k_max_given: bool = True) -> dict:
    """The plan of every (policy, hardware) pair; written to `out`/plan.json. As in tune, a fixed
    k past a k_max the user did not set (`k_max_given`) runs with k_max = k."""
    from spectune.tune import BASELINE, scheduler_for

    slo = build_slo(scenario)
    if slo is None:
        raise ConfigError("plan needs an SLO: give --slo-ttft and/or --slo-tpot")
    started = time.perf_counter()
    if scenario.profile and spec.tp_options is not None:
        raise ConfigError("--tp-options compares GPU groups on the roofline; a --profile was "
                          "timed on one device: drop --tp-options")
    options = [None] if scenario.profile else spec.hardware_list()
    shapes, skipped = _shapes(scenario, scheduler, options, spec.tp_list(scenario.tp))
    grouped = _grouped(spec, scenario)
    brackets = [_Bracket(c, h, tp) for c in _candidates(spec.policies) for h, tp in shapes]
    first = Task(_scenario(scenario, *shapes[0]), scheduler, BASELINE, 1.0, 0)
    note_short_trace(scenario, seeded_inputs(first)[0])
    curves: list[dict] = []
    with Runner(out / "evals" if out else None, spec.jobs, progress,
                spec.executor, spec.ray_address) as runner:

        def attain(pairs: list[tuple[_Bracket, float]]) -> list[dict]:
            tasks = [Task(_scenario(scenario, b.hardware, b.tp),
                          scheduler_for(scheduler, b.candidate, k_max_given), b.candidate, r, 0)
                     for b, r in pairs]
            results = runner.run(tasks)
            for (b, r), m in zip(pairs, results):
                curves.append({"policy": b.candidate.policy, "label": b.candidate.label,
                               "hardware": _hw(scenario, b.hardware, b.tp, grouped),
                               "rate": r, **m})
            return results

        while open_ := [b for b in brackets if not b.done(spec.tolerance)]:
            for b, m in zip(open_, attain([(b, b.probe()) for b in open_])):
                rate = b.probe()
                if (m["slo_attainment"] or 0.0) >= spec.attainment:
                    b.lo = rate
                else:
                    b.hi = rate
        probes = [(b, f * b.lo) for b in brackets for f in (0.95, 1.05) if b.lo > 0]
        checks = {(id(b), "below" if r < b.lo else "above"): {"rate": r, "slo_attainment":
                  m["slo_attainment"]} for (b, r), m in zip(probes, attain(probes))}
    plans = _plans(spec, scenario, brackets, checks, grouped)
    for plan in plans:
        if plan["max_rate_per_replica"] is None:
            plan["why_no_capacity"] = why_no_capacity(plan, curves, slo, spec.attainment)
    result = {"kind": "plan", "meta": {
        "workload": scenario.workload, "acceptance": scenario.acceptance,
        "slo": {k: v for k, v in asdict(slo).items() if v is not None},
        "attainment_target": spec.attainment, "target_rate": spec.target_rate,
        "scheduler": asdict(scheduler), "spec": spec.as_record(),
        "scenario": scenario.as_record(), "simulations": runner.total,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - started},
        "plans": plans, "curves": sorted(curves, key=lambda c: (c["label"], c["hardware"],
                                                                 c["rate"]))}
    if skipped:
        result["skipped"] = skipped
    if grouped:
        result["choices"] = _choices(plans)
        result["best_per_shape"] = _best_per_shape(plans)
        if overall := _overall_choice(result["best_per_shape"]):
            result["choice"] = overall
    if out is not None:
        from spectune.files import write_json

        write_json(out / "plan.json", result)
    return result


def why_no_capacity(plan: dict, curves: list[dict], slo, attainment: float) -> str:
    """Why no rate met the SLOs, from the lowest rate tried: its attainment and each p99 that
    exceeds its SLO ("even at 0.0078 req/s, p99 TTFT is 95.2 ms > the SLO of 1 us")."""
    mine = [c for c in curves if c["label"] == plan["label"] and c["hardware"] == plan["hardware"]]
    lowest = min(mine, key=lambda c: c["rate"])
    reached = lowest["slo_attainment"] or 0.0
    parts = [f"{reached:.1%} of requests met the SLOs (< {attainment:.0%})"]
    for name, metric, bound in (("TTFT", "ttft_p99_s", slo.ttft_s), ("TPOT", "tpot_p99_s",
                                                                   slo.tpot_s)):
        value = lowest.get(metric)
        if bound is not None and value is not None and value > bound:
            parts.append(f"p99 {name} is {seconds(value)} > the SLO of {seconds(bound)}")
    return f"even at the lowest rate tried, {lowest['rate']:.3g} req/s, " + "; ".join(parts)


def _scenario(scenario: SimulationSpec, hardware: str | None, tp: int = 1) -> SimulationSpec:
    if hardware is None:
        return scenario
    return replace(scenario, hardware=hardware, tp=tp)


def _grouped(spec: PlanSpec, scenario: SimulationSpec) -> bool:
    """The plan compares GPU groups (its rows say TP and GPUs): --tp-options or a --tp > 1."""
    return spec.tp_options is not None or scenario.tp != 1


def _hw(scenario: SimulationSpec, hardware: str | None, tp: int = 1,
        grouped: bool = False) -> str:
    """The name of a plan's hardware option: the GPU, or with groups the shape "H100-SXM TP4"."""
    if hardware is None:
        return f"profile {scenario.profile}"
    return f"{hardware} TP{tp}" if grouped else hardware


def _shapes(scenario: SimulationSpec, scheduler: SchedulerConfig, options: list[str | None],
            degrees: list[int]) -> tuple[list[tuple[str | None, int]], list[dict]]:
    """(the (hardware, TP) shapes to plan, the skipped ones with why). A shape is skipped when
    the roofline refuses it: a degree that does not split the model's heads, weights that leave
    no room for KV. None planned: the reasons, as one error."""
    if options == [None]:  # a profile brings its own device
        return [(None, 1)], []
    shapes, skipped = [], []
    for hardware in options:
        for tp in degrees:
            try:
                build_latency(_scenario(scenario, hardware, tp), scheduler)
            except ConfigError as exc:
                skipped.append({"hardware": hardware, "tp": tp, "why": str(exc)})
                continue
            shapes.append((hardware, tp))
    if not shapes:
        raise ConfigError("no hardware option fits: " + " | ".join(
            f"{s['hardware']} at TP {s['tp']}: {s['why']}" for s in skipped))
    return shapes, skipped


def _plans(spec: PlanSpec, scenario, brackets: list[_Bracket], checks: dict,
           grouped: bool = False) -> list[dict]:
    prices = spec.price_map()
    out = []
    for b in brackets:
        replicas = None
        if spec.target_rate is not None and b.lo > 0:
            replicas = math.ceil(spec.target_rate / b.lo)
        price = prices.get(b.hardware or "")
        gpus = replicas * b.tp if replicas else None
        row = {"policy": b.candidate.policy, "params": b.candidate.params_dict,
               "label": b.candidate.label, "hardware": _hw(scenario, b.hardware, b.tp, grouped),
               "max_rate_per_replica": b.lo if b.lo > 0 else None,
               "replicas_needed": replicas,
               "cost_per_hour": gpus * price if gpus and price is not None else None,
               "checks": {side: checks[(id(b), side)] for side in ("below", "above")
                          if (id(b), side) in checks}}
        if grouped:
            row.update({"gpu": b.hardware, "tp": b.tp, "gpus_needed": gpus})
        out.append(row)
    return out


def _choices(plans: list[dict]) -> list[dict]:
    """Per policy, the shape that serves the target rate with the lowest cost per hour where
    every shape is priced, else with the fewest GPUs (ties: the first listed); none without a
    target rate or where no shape has capacity."""
    out = []
    for label in dict.fromkeys(p["label"] for p in plans):
        mine = [p for p in plans if p["label"] == label and p["gpus_needed"]]
        if not mine:
            continue
        priced = all(p["cost_per_hour"] is not None for p in mine)
        best = min(mine, key=lambda p: p["cost_per_hour"] if priced else p["gpus_needed"])
        out.append({"label": label, "hardware": best["hardware"], "gpu": best["gpu"],
                    "tp": best["tp"], "replicas_needed": best["replicas_needed"],
                    "gpus_needed": best["gpus_needed"], "cost_per_hour": best["cost_per_hour"],
                    "by": "cost per hour" if priced else "GPUs"})
    return out


def _best_per_shape(plans: list[dict]) -> list[dict]:
    """Per shape, the policy that sustains the highest rate per replica there: speculation
    pays differently at each degree (a group's decode is cheaper, its all-reduces a fixed cost
    per step), so the policy is chosen per shape, not once for all. Ties: the first listed."""
    out = []
    for shape in dict.fromkeys(p["hardware"] for p in plans):
        mine = [p for p in plans if p["hardware"] == shape and p["max_rate_per_replica"]]
        if not mine:
            continue
        best = max(mine, key=lambda p: p["max_rate_per_replica"])  # max keeps the first of ties
        out.append({"hardware": shape, "gpu": best["gpu"], "tp": best["tp"],
                    "label": best["label"], "max_rate_per_replica": best["max_rate_per_replica"],
                    "replicas_needed": best["replicas_needed"],
                    "gpus_needed": best["gpus_needed"], "cost_per_hour": best["cost_per_hour"]})
    return out


def _overall_choice(best: list[dict]) -> dict | None:
    """The shape, with its own best policy, that serves the target rate cheapest (per hour where
    every shape is priced, else in GPUs); None without a target rate."""
    mine = [b for b in best if b["gpus_needed"]]
    if not mine:
        return None
    priced = all(b["cost_per_hour"] is not None for b in mine)
    choice = min(mine, key=lambda b: b["cost_per_hour"] if priced else b["gpus_needed"])
    return {**choice, "by": "cost per hour" if priced else "GPUs"}


def from_tune(folder: Path, slos: SimulationSpec
              ) -> tuple[SimulationSpec, SchedulerConfig, str, bool]:
    """(scenario, scheduler, policies, k_max_given) of the tune in `folder`: its scenario with
    the SLOs of `slos`, its scheduler, its recommended policies, best fixed k and plain decoding,
    and whether its k_max was the user's (if not, a fixed k it found past it runs as it did)."""
    import json

    file = Path(folder) / "tune.json"
    try:
        result = json.loads(file.read_text())
        meta, chosen = result["meta"], result["recommendations"] + result["best_fixed"]
        scenario = SimulationSpec(**meta["scenario"])
        scheduler = SchedulerConfig(**meta["scheduler"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--from-tune {folder}: not a folder written by spectune tune "
                          f"({exc.__class__.__name__}: {exc})") from None
    scenario = replace(scenario, slo_ttft=slos.slo_ttft, slo_tpot=slos.slo_tpot)
    labels = ["fixed:k=0"]
    for row in chosen:
        pairs = [f"{k}={_exact(v)}" for k, v in sorted(row["params"].items())]
        label = ":".join([row["policy"], *pairs])
        if label not in labels:
            labels.append(label)
    return scenario, scheduler, ",".join(labels), bool(meta.get("k_max_given", True))


def _exact(value) -> str:
    """A parameter value as text that parses back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from spectune.flags import add_dataclass_flags
    from spectune.tune import SCENARIO_SHOWN, TUNE_SCENARIO

    p = subparsers.add_parser(
        "plan", help="maximum request rate per replica under SLOs; replicas",
        description="For each policy and hardware option: the highest request rate one replica "
        "sustains with the SLOs met (bisection over simulations), replicas for --target-rate and "
        "their cost.")
    add_dataclass_flags(p, SimulationSpec, "scenario: workload, models, acceptance, SLOs",
                        skip=("rate", "policy", "hardware", "duration"), shown=SCENARIO_SHOWN)
    p.set_defaults(**TUNE_SCENARIO)
    add_dataclass_flags(p, PlanSpec, "plan")
    add_dataclass_flags(p, SchedulerConfig, "scheduler (mirror the live engine's settings)",
                        shown={"k_max": f"{SchedulerConfig.k_max}; unset, a fixed k above it "
                               "runs with k_max = k"})
    p.set_defaults(k_max=None)
    p.add_argument("--from-tune", type=Path, metavar="DIR",
                   help="plan for what a tune recommended: its scenario, scheduler and "
                        "recommended policies (with the best fixed k and plain decoding) from "
                        "DIR/tune.json; the SLOs, plan flags and a --k-max given here still "
                        "come from here")
    p.add_argument("--out", type=Path, default=Path("runs/plan"),
                   help="folder for plan.json and evals/ (a rerun resumes) (default: runs/plan)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(args: argparse.Namespace) -> int:
    from spectune.evaluate import progress_bar
    from spectune.files import prepare_out, to_json
    from spectune.flags import dataclass_from_args

    scenario = dataclass_from_args(SimulationSpec, args)
    spec = dataclass_from_args(PlanSpec, args)
    k_max_given = args.k_max is not None
    scheduler = dataclass_from_args(SchedulerConfig, args, **(
        {} if k_max_given else {"k_max": SchedulerConfig.k_max}))
    if args.from_tune is not None:
        scenario, tuned, policies, tuned_k_max_given = from_tune(args.from_tune, scenario)
        spec = replace(spec, policies=policies)
        if k_max_given:  # --k-max given here: the engine's limit, over the tune's
            scheduler = replace(tuned, k_max=scheduler.k_max)
        else:
            scheduler, k_max_given = tuned, tuned_k_max_given
    prepare_out(args.out)
    result = run_plan(spec, scenario, scheduler, args.out, progress_bar("plan"), k_max_given)
    if args.format == "json":
        keys = ("policy", "params", "hardware", "max_rate_per_replica", "replicas_needed",
                "cost_per_hour", "why_no_capacity")
        if "choices" in result:  # GPU groups: each row's degree and GPUs, and the choices
            keys = (*keys[:3], "gpu", "tp", *keys[3:5], "gpus_needed", *keys[5:])
        doc = {"plans": [{k: p.get(k) for k in keys} for p in result["plans"]]}
        for extra in ("skipped", "choices", "best_per_shape", "choice"):
            if extra in result:
                doc[extra] = result[extra]
        print(to_json(doc))
        return 0
    print(format_plan(result))
    m = result["meta"]
    print(f"\nwritten to {args.out}/plan.json ({m['simulations']} simulations, "
          f"{m['wall_s']:.0f} s)")
    return 0


def format_plan(result: dict) -> str:
    """One block per policy, its full label on a line of its own (never cut), a row per
    hardware option; a policy with no capacity says why."""
    m = result["meta"]
    slo = ", ".join(f"{k.removesuffix('_s').upper()} <= {seconds(v)}" for k, v in m["slo"].items())
    lines = [f"SLO {slo} met by {m['attainment_target']:.0%} of requests; workload "
             f"{m['workload']}, acceptance {m['acceptance']}"]
    grouped = "choices" in result  # GPU groups: TP and GPUs columns, each policy's choice
    header = ("hardware", "max req/s", "replicas", "cost/h", "at 0.95x", "at 1.05x")
    if grouped:
        header = ("hardware", "TP", "max req/s", "replicas", "GPUs", "cost/h", "at 0.95x",
                  "at 1.05x")

    def fmt(v, f):
        return "-" if v is None else format(v, f)

    cells = {}
    for p in result["plans"]:
        below = p["checks"].get("below", {}).get("slo_attainment")
        above = p["checks"].get("above", {}).get("slo_attainment")
        cells[id(p)] = (p["hardware"], fmt(p["max_rate_per_replica"], ".2f"),
                        fmt(p["replicas_needed"], "d"), fmt(p["cost_per_hour"], ".2f"),
                        fmt(below, ".1%"), fmt(above, ".1%"))
        if grouped:
            cells[id(p)] = (p["gpu"], str(p["tp"]), *cells[id(p)][1:3],
                            fmt(p["gpus_needed"], "d"), *cells[id(p)][3:])
    widths = [max(len(h), *(len(c[i]) for c in cells.values())) for i, h in enumerate(header)]

    def row(values) -> str:
        return "    " + "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                  for i, (v, w) in enumerate(zip(values, widths)))

    lines.append(row(header))
    choices = {c["label"]: c for c in result.get("choices", [])}
    for label in dict.fromkeys(p["label"] for p in result["plans"]):
        lines.append(label)
        for p in (p for p in result["plans"] if p["label"] == label):
            lines.append(row(cells[id(p)]))
            if p.get("why_no_capacity"):
                lines.append(f"      no capacity: {p['why_no_capacity']}")
        if label in choices:
            c = choices[label]
            cost = "" if c["cost_per_hour"] is None else f", {c['cost_per_hour']:.2f}/h"
            lines.append(f"      choice ({c['by']}): {c['replicas_needed']} x {c['gpu']} TP "
                         f"{c['tp']} = {c['gpus_needed']} GPUs{cost}")
    if result.get("best_per_shape"):
        lines.append("the best policy per shape")
        for b in result["best_per_shape"]:
            lines.append(f"    {b['gpu']} TP {b['tp']}: {b['label']}, "
                         f"{b['max_rate_per_replica']:.2f} req/s per replica")
    if c := result.get("choice"):
        cost = "" if c["cost_per_hour"] is None else f", {c['cost_per_hour']:.2f}/h"
        lines.append(f"choice ({c['by']}, each shape with its best policy): "
                     f"{c['replicas_needed']} x {c['gpu']} TP {c['tp']} = {c['gpus_needed']} "
                     f"GPUs{cost}, {c['label']}")
    for s in result.get("skipped", []):
        lines.append(f"skipped {s['hardware']} at TP {s['tp']}: {s['why']}")
    return "\n".join(lines)
