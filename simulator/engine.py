"""The serving simulation: an arrival process, a router and N replica processes in SimPy."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from policies import Policy, StepCost
from simulator import kernels
from simulator.acceptance import replay_for
from simulator.config import ClusterConfig, SchedulerConfig
from simulator.draft_tree import TreeShape
from simulator.errors import ConfigError
from simulator.latency import LatencyModel
from simulator.logs import RequestLog, StepLog, StepTotals
from simulator.replica import Replica, check_fits
from simulator.request import RequestState
from simulator.scheduler import scheduler_class
from simulator.step_cost import StepCostModel
from simulator.stepped import repays_loading
from simulator.whole_run import repays_loading_from, run_whole, takes_whole_run
from traces import SpeculationTrace, Workload


@dataclass(frozen=True)
class SimulationResult:
    """Per-request and per-step records (empty when the run kept no steps: `totals` has what
    the summary needs of them), and where every input came from."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    meta: dict = field(default_factory=dict)
    totals: StepTotals | None = None


class _Arrival(simpy.events.Event):
    """A timeout at URGENT priority: an arrival at time t is routed before any iteration that
    ends at t completes, so a request arriving exactly on an iteration boundary is always seen
    by the next iteration and the router always sees the loads from before that boundary,
    however the iterations were scheduled (one at a time, or a whole fast-path segment)."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, simpy.events.URGENT, delay)


#: requests whose Python values the arrival process makes at a time (and flushes steps between)
ARRIVAL_CHUNK = 4096


def arrivals(env: simpy.Environment, workload: Workload, arrival_s: np.ndarray,
             cluster: _Cluster, steps: StepLog):
    """The arrival process: each request reaches the router at its arrival time. A request's
    state is made when it arrives (and dropped when it finishes), so memory holds the requests
    in flight, not the workload: Python values are taken `chunk` requests at a time, and
    streamed step records are flushed as often."""
    chunk = ARRIVAL_CHUNK
    for first in range(0, len(arrival_s), chunk):
        steps.flush({r.index: env.now if r.idle else None for r in cluster.replicas})
        last = first + chunk
        rows = zip(workload.request_ids[first:last].tolist(), arrival_s[first:last].tolist(),
                   workload.prompt_tokens[first:last].tolist(),
                   workload.output_tokens[first:last].tolist())
        for i, (rid, a, p, o) in enumerate(rows, first):
            request = RequestState(i, int(rid), float(a), int(p), int(o))
            delay = request.arrival_s - env.now
            if delay > 0:
                yield _Arrival(env, delay)
            cluster.next_index = i + 1
            cluster.route(i).submit(request)


class _Cluster:
    """Router state shared by the arrival process and the replicas' fast paths."""

    def __init__(self, arrival_s: np.ndarray, router: str) -> None:
        self.arrival_s = arrival_s
        self.router = router
        self.replicas: list[Replica] = []
        self.next_index = 0

    def route(self, i: int) -> Replica:
        if self.router == "round-robin":
            return self.replicas[i % len(self.replicas)]
        return min(self.replicas, key=lambda r: (r.load, r.index))

    def next_arrival_s(self, replica: int) -> float:
        """When the next request that could change `replica`'s state arrives.

        Round-robin routing is fixed in advance, so only this replica's own arrivals count;
        least-loaded routing reads every replica's load, so every arrival counts.
        """
        i, n = self.next_index, len(self.replicas)
        if self.router == "round-robin":
            i += (replica - i) % n
        return float(self.arrival_s[i]) if i < len(self.arrival_s) else np.inf


def _draft_tree(latency: LatencyModel, acceptance: SpeculationTrace) -> TreeShape | None:
    """The tree a step drafts: the latency model's, else the one the trace was recorded with
    (`spectune record --drafter eagle-tree` writes it in the meta); both must agree."""
    meta = getattr(acceptance, "meta", None) or {}
    recorded = meta.get("tree")
    try:
        recorded = TreeShape(tuple(tuple(p) for p in recorded)) if recorded else None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"speculation trace {meta.get('source', '')!r}: its meta's draft "
                          f"tree is not one ({error})") from None
    given = latency.draft_tree
    if given is not None and recorded is not None and given != recorded:
        raise ConfigError("the latency model's draft tree is not the one the speculation trace "
                          "was recorded with: record the trace with the same tree")
    return given if given is not None else recorded


def simulate(
    workload: Workload,
    latency: LatencyModel,
    acceptance: SpeculationTrace,
    policy: Policy,
    kv_capacity_tokens: int,
    scheduler: SchedulerConfig | None = None,
    cluster: ClusterConfig | None = None,
    fast_path: bool = True,
    policy_cost: StepCost | None = None,
    keep_steps: bool = True,
    steps_sink: Callable[[pd.DataFrame], None] | None = None,
) -> SimulationResult:
    """Serve `workload` under `policy`; each replica gets its own copy of the policy.

    `policy_cost` is the cost model policies read (StepContext.cost); by default the one that
    times the iterations. `validate` passes the live engine's, so a policy that reads costs
    decides in simulation from exactly what it was given live. `keep_steps` False keeps the
    steps' totals only (memory flat in the run's length; `steps` is then empty); `steps_sink`
    receives the steps instead, in order, a frame at a time, as they become final.
    """
    scheduler = scheduler or SchedulerConfig()
    cluster = cluster or ClusterConfig()
    if kv_capacity_tokens < 1:
        raise ConfigError(f"KV capacity must be >= 1 token, got {kv_capacity_tokens}")
    arrival_s = np.asarray(workload.arrival_s, dtype=np.float64)
    arrival_s = arrival_s - arrival_s[0]
    check_fits(workload.request_ids, workload.prompt_tokens, workload.output_tokens, scheduler,
               kv_capacity_tokens)
    replay = replay_for(acceptance, workload.output_tokens, policy, scheduler.k_max)
    cost = StepCostModel(latency, draft_tree=_draft_tree(latency, acceptance),
                         speculating=policy.may_draft(scheduler.k_max))
    # the per-request loops (and the policy's per-step ones): compiled where it pays (once)
    repays_from = repays_loading(policy,
                                 scheduler_class(scheduler.scheduler).plans_whole_step)
    whole_from = repays_loading_from(policy, scheduler, cost, fast_path, steps_sink)
    if whole_from and (not repays_from or whole_from < repays_from):
        repays_from = whole_from
    kernels.prepare(len(workload), len(workload) / repays_from if repays_from else 0.0)
    started = time.perf_counter()
    env = simpy.Environment()
    steps, requests = StepLog(keep_steps, steps_sink), RequestLog(len(workload))
    router = _Cluster(arrival_s, cluster.router)
    for r in range(cluster.replicas):
        router.replicas.append(Replica(env, r, scheduler, kv_capacity_tokens, cost,
                                       copy.deepcopy(policy), replay, steps, requests,
                                       router.next_arrival_s, fast_path, policy_cost))
    whole = takes_whole_run(router.replicas, policy, steps)
    if whole:  # the same records, in one compiled loop (simulator/whole_run.py)
        run_whole(router.replicas, cluster.router, arrival_s, workload.request_ids,
                  workload.prompt_tokens, workload.output_tokens, replay, steps, requests)
    else:
        for replica in router.replicas:
            env.process(replica.serve())
        env.process(arrivals(env, workload, arrival_s, router, steps))
        env.run()
    engine_s = time.perf_counter() - started
    req_df = requests.frame(workload.request_ids, workload.prompt_tokens, workload.output_tokens)
    meta = {
        "workload": workload.source,
        "requests": len(workload),
        "latency_model": latency.source,
        "acceptance": replay.describe(),
        "policy": {"name": policy.name, "params": policy.params()},
        "scheduler": scheduler.__dict__,
        "cluster": cluster.__dict__,
        "kv_capacity_tokens": int(kv_capacity_tokens),
        "fast_path": router.replicas[0].takes_segments,
        # decode steps run many at a time in compiled runs (simulator/stepped.py): what ran
        # them, not what they gave (the same records either way)
        "steps_at_once": router.replicas[0].steps_at_once,
        "whole_run": whole,  # ... or the whole run in one (simulator/whole_run.py)
        "engine_s": engine_s,
    }
    steps.close()
    steps_df = steps.frame()
    totals = StepTotals.from_frame(steps_df) if steps.keep else steps.totals()
    meta["wall_s"] = time.perf_counter() - started
    return SimulationResult(req_df, steps_df, meta, totals)
