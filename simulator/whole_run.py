"""A whole run in one compiled loop (simulator/compiled_serve.py), where it gives the SimPy
processes' records to the bit: the plain scheduler (whole prompts, or chunked prefill with a
model-free chain), any replicas behind either router, a policy that drafts one k everywhere
(`Policy.constant_k`) or one by the running batch's size (`Policy.k_by_batch`) or walks each
request apart from the others (`Policy.walks_apart`), a chain priced on the roofline from the
batch's kept sums, the compiled loops loaded.

Why: under load a decode segment lasts a step or two, and each request's arrival, admission,
prefill, walk and finish in Python cost more than its decode steps (docs/speed.md, "A whole run
compiled"). Everywhere else the SimPy processes run (`takes_whole_run` False).

The loop reads each request's acceptance run and its drafter's caps (or its walk) from a window
of requests, loaded here a chunk at a time as admission reaches them (from the first request a
replica has waiting or, chunked, prefilling, or by batch size running, to 4,096 on or the last
arrived), so memory holds the requests in flight, not the workload; its step records come back
a buffer at a time into the step log.
"""

from __future__ import annotations

import numpy as np

from policies import Policy
from simulator import kernels
from simulator.acceptance import AcceptanceReplay
from simulator.config import SchedulerConfig
from simulator.draft_feed import FIRST_FEED
from simulator.logs import STEP_COLUMNS, RequestLog, StepLog
from simulator.replica import Replica
from simulator.request import RequestState
from simulator.scheduler import Scheduler
from simulator.step_cost import StepCostModel

#: requests whose acceptance runs a window holds
CHUNK = 4096
#: step records per buffer handed to the step log
BUFFER = 65536
#: the kept sums' first capacity, in steps (BatchColumns')
SUMS = 4096


#: the requests from which a run that the whole run would take repays loading the compiled
#: loops (about 0.4 s in a fresh process): `spectune simulate` of the n-gram recording at
#: 8 req/s, fixed k=4, one core, the loops loaded against not: with Llama-68M's chain 0.95 s
#: against 0.89 at 3,000 requests, 0.96 against 1.44 at 6,000; model-free 0.97 against 0.81
#: at 5,000, 1.02 against 1.25 at 10,000
REPAYS_FROM = {True: 4_000, False: 8_000}  # (with a draft model, model-free)


def repays_loading_from(policy: Policy, scheduler: SchedulerConfig, cost: StepCostModel,
                        fast_path: bool, sink) -> int:
    """The requests from which a run repays loading the compiled loops for the whole run
    (0: it would not take it): what `takes_whole_run` checks, known before any replica is
    made (a walked policy's is not: it loads them as other runs do)."""
    if not (fast_path and sink is None and constant_k(policy, scheduler.k_max) is not None
            and scheduler.scheduler == Scheduler.name
            and cost._roofline is not None and cost.draft_tree is None and not cost.idle_s
            and not (scheduler.chunked_prefill and cost._roofline["draft"] is not None)):
        return 0
    return REPAYS_FROM[cost._roofline["draft"] is not None]


def constant_k(policy: Policy, k_max: int) -> int | None:
    """`Policy.constant_k`, where the class that says it also chose (`replaces`)."""
    return policy.constant_k(k_max) if type(policy).replaces("constant_k", "choose") else None


def k_by_batch(replica: Replica) -> np.ndarray | None:
    """The k of each running batch's size (`Policy.k_by_batch`, where the class that says it
    also chose; one k for all where `constant_k` says so), up to the most a replica runs."""
    policy, k_max = replica.policy, replica.config.k_max
    largest = max(1, replica.config.max_num_seqs)
    k = constant_k(policy, k_max)
    if k is not None:
        return np.full(largest + 1, k, np.int64)
    if not type(policy).replaces("k_by_batch", "choose"):
        return None
    table = policy.k_by_batch(replica.scheduler.cost, k_max, largest)
    if table is None or not all(0 <= k <= k_max for k in table[1:]):
        return None  # (a k the engine refuses: the processes say so)
    return np.asarray(table, dtype=np.int64)


def takes_whole_run(replicas: list[Replica], policy: Policy, steps: StepLog) -> bool:
    """Whether this run takes the compiled loop: where its records are the SimPy process's."""
    if kernels.compiled() is None or steps.sink is not None:
        return False
    replica = replicas[0]
    cost = replica.cost
    # a walked policy whose walks are each request's own, made ahead of the run (`_walks`)
    walked = (replica.walks and not replica.checks_walks and policy.walks_apart()
              and type(policy).replaces("walks_apart", "walker"))
    return ((walked or (not replica.walks and k_by_batch(replica) is not None))
            and type(replica.scheduler) is Scheduler
            and (replica.segments_only or replica.chunk_sums) and replica.lazy
            and not replica.holds
            and cost._roofline is not None
            and cost.draft_tree is None and not cost.idle_s)


def run_whole(replicas: list[Replica], router: str, arrival_s: np.ndarray,
              request_ids: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
              acceptance: AcceptanceReplay, steps: StepLog, requests: RequestLog) -> None:
    """Serve the workload on `replicas` (their configuration; their SimPy processes never
    start), writing the request and step records the processes would write."""
    from simulator import compiled_serve as loop  # (loaded with the compiled loops)

    replica = replicas[0]
    config, cost = replica.config, replica.cost
    prompt = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    output = np.ascontiguousarray(output_tokens, dtype=np.int64)
    arrival = np.ascontiguousarray(arrival_s, dtype=np.float64)
    capped, draft = bool(replica.varied), bool(replica.feeds)
    rows = config.k_max + 1 if draft or (capped and steps.records_rows) else 0
    settings = np.zeros(loop.CONFIG, np.int64)
    ktable = np.zeros(1, np.int64) if replica.walks else k_by_batch(replica)
    by_batch = not replica.walks and len(set(ktable[1:].tolist())) > 1
    settings[[loop.K, loop.K_MAX, loop.CAPPED, loop.ROWS, loop.KV_CAPACITY, loop.MAX_SEQS]] = (
        ktable[-1], config.k_max, capped, rows, replica.scheduler.kv_capacity,
        config.max_num_seqs)
    settings[loop.BUDGET] = -1 if config.max_batched_tokens is None else config.max_batched_tokens
    settings[[loop.DRAFT, loop.RULE, loop.FIRST_FEED, loop.ROUTER, loop.CHUNKS]] = (
        draft, kernels.compiled().RULES[replica.catch_up], FIRST_FEED,
        loop.ROUND_ROBIN if router == "round-robin" else loop.LEAST_LOADED,
        config.chunked_prefill)
    settings[loop.WALKS], settings[loop.BY_BATCH] = replica.walks, by_batch
    numbers = np.array([*_numbers(cost._roofline["target"]), *_overheads(cost.latency),
                        *_numbers(cost._roofline["draft"] or cost._roofline["target"])])
    n = len(replicas)
    ints, floats = np.zeros(loop.INTS, np.int64), np.zeros(loop.FLOATS)
    state, times = np.zeros((n, loop.STATE), np.int64), np.zeros(n)
    seats = max(1, min(config.max_num_seqs, len(output)))
    running, ends = np.zeros((n, seats), np.int64), np.zeros((n, seats), np.int64)
    totals = np.zeros((n, loop.TOTALS, seats), np.int64)
    pending = np.zeros((n, seats), np.int64)
    prefilled = np.zeros((n, seats), np.int64)
    sums = np.zeros((n, 4 + rows + (rows + 2 if draft else 0), SUMS), np.int64)
    records = np.empty((len(STEP_COLUMNS), BUFFER))
    window = (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64), 0, 0)
    while True:
        runs, run_at, caps, lo, hi = window
        status, sums = loop.serve(
            ints, floats, state, times, settings, ktable, numbers, arrival, prompt, output, runs,
            run_at, caps, lo, hi, sums, running, ends, totals, pending, prefilled, records,
            requests.replica, requests.arrival_s, requests.admitted_s, requests.first_token_s,
            requests.finish_s, requests.steps, requests.drafted, requests.accepted)
        if status == loop.NEED_RUNS:  # from the first request any replica has waiting, or
            # (chunked prefill) is prefilling, or (by batch size) is running
            first = int(min(state[state[:, loop.WAITING] > 0, loop.HEAD].min(initial=len(output)),
                            pending[state[:, loop.PREFILLING] > 0, 0].min(initial=len(output)),
                            min((running[r, :state[r, loop.RUNNING]].min(initial=len(output))
                                 for r in range(n)), default=len(output))
                            if by_batch else len(output)))
            arrived = int(ints[loop.NEXT])
            last = min(len(output), max(first + CHUNK, arrived))
            window = (_walks(replica, acceptance, request_ids, prompt, output, first, last)
                      if replica.walks else _window(replica, acceptance, output, first, last))
            continue
        used = int(ints[loop.USED])
        if used:
            steps.add_block(records[:, :used].copy())
            ints[loop.USED] = 0
        if status == loop.FLUSH:
            if not used:  # a segment longer than the buffer
                records = np.empty((records.shape[0], 2 * records.shape[1]))
            continue
        if status == loop.STUCK:
            raise RuntimeError("replica holds requests it can neither admit nor run")
        return


def _numbers(numbers: tuple) -> tuple[float, ...]:
    """A role's pass numbers as floats (its all-reduces' flag as 0 or 1)."""
    return tuple(float(x) for x in numbers)


def _window(replica: Replica, acceptance: AcceptanceReplay, output: np.ndarray, lo: int,
            hi: int) -> tuple:
    """Requests lo..hi-1's acceptance runs and (capped) caps, end to end, and where each
    starts: what `Replica.submit` gives each request (`run`, `_caps`)."""
    lengths = output[lo:hi]
    run_at = np.zeros(hi - lo + 1, np.int64)
    np.cumsum(lengths, out=run_at[1:])
    runs = np.empty(int(run_at[-1]), np.int64)
    caps = np.empty(len(runs) if replica.capped else 0, np.int64)
    for i in range(lo, hi):
        at, end = run_at[i - lo], run_at[i - lo + 1]
        runs[at:end] = acceptance.run(i)
        if replica.capped:
            caps[at:end] = replica._caps(i)
    return runs, run_at, caps, lo, hi


def _walks(replica: Replica, acceptance: AcceptanceReplay, request_ids: np.ndarray,
           prompt: np.ndarray, output: np.ndarray, lo: int, hi: int) -> tuple:
    """`_window` for a walked policy: requests lo..hi-1's walks by its walker from their first
    token (`Replica._walk_alone`: each request's walk its own, whenever it is walked; the
    policy forgets the request after, as at its finish), end to end (`runs`: the tokens
    generated before each step and after the last; `caps`: each step's drafts, at the same
    offsets), and where each starts."""
    walks, run_at = [], np.zeros(hi - lo + 1, np.int64)
    for i in range(lo, hi):
        chain = drafts = _NOTHING
        if output[i] > 1:
            request = RequestState(i, int(request_ids[i]), 0.0, int(prompt[i]), int(output[i]))
            request.generated = 1
            request.run = acceptance.run(i)
            if replica.capped:
                request.cap = replica._caps(i)
            if replica._signal_names:
                request.signals = {name: acceptance.signal(i, name)
                                   for name in replica._signal_names}
            replica._walk_alone(request)
            replica.policy.finish(request.request_id)
            chain, drafts = request.chain, request.chain_ks
        walks.append((chain, drafts))
        run_at[i - lo + 1] = run_at[i - lo] + len(chain)
    runs = np.concatenate([chain for chain, _ in walks]) if walks else _NOTHING
    caps = np.zeros(len(runs), np.int64)
    for (_, drafts), at in zip(walks, run_at[:-1].tolist()):
        caps[at: at + len(drafts)] = drafts
    return runs, run_at, caps, lo, hi


_NOTHING = np.zeros(0, np.int64)


def _overheads(latency) -> tuple[float, float]:
    """The roofline's host seconds per step and per running request (`step_overhead_s`)."""
    params = latency.params
    return float(params.step_overhead_s), float(params.per_seq_overhead_s)
