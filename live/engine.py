"""The live engine: continuous batching with speculative decoding on real forward passes.

It is the simulator's replica (simulator/replica.py) with the clock and the acceptance made real,
executing the same scheduler (simulator/scheduler.py) rule for rule, so that `validate` compares
like with like: FCFS admission under the batch, KV and token limits; prefills in an iteration of
their own (or chunked beside decode steps: live/mixed.py); decode iterations of choose k, draft,
one verify pass (live/verify.py), observe. Records have the simulator's schema with measured
seconds. Replay mode (`replay=`, live/replay.py) keeps every pass real but takes tokens and
acceptance from a speculation trace. The iteration rule by rule, what a record's seconds cover,
and replay: docs/live-engine.md.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from drafters.base import Drafter
from live.loop import LiveLoop
from live.mixed import ChunkedLoop
from live.replay import ReplayDrafter, ReplayScript
from live.requests import EngineClock, LiveRequest, VirtualClock
from models.llama import KVPoolTooSmall, LlamaModel
from models.paged_kv import BLOCK_SIZE
from policies import Policy, StepCost
from simulator.config import SchedulerConfig
from simulator.errors import ConfigError
from simulator.replica import check_fits
from simulator.scheduler import scheduler_class
from traces import SpeculationTrace, Workload

DECODE_LOG_COLUMNS = ("request_id", "step", "position", "k", "drafted", "accepted", "emitted")

__all__ = ["DECODE_LOG_COLUMNS", "LiveEngine", "LiveResult", "MissingCost"]


@dataclass(frozen=True)
class LiveResult:
    """Per-request and per-step records (the simulator's schema), the tokens, and provenance.

    `outputs[i]` are the token ids generated for workload row i. `decode_log` has one row per
    decode step of each request (DECODE_LOG_COLUMNS; `position` = tokens generated before the
    step, `k` = the policy's choice, `drafted` = what the drafter proposed): the sequence a
    replay-exactness check compares with the simulator's. `pass_s[i]` is the time step i
    spent inside forward passes (wall time on CPU; on CUDA the GPU time between events around
    each pass, since the host only launches them), so `steps.duration_s - pass_s` is its host
    time.
    """

    requests: pd.DataFrame
    steps: pd.DataFrame
    outputs: tuple[tuple[int, ...], ...]
    decode_log: pd.DataFrame
    meta: dict = field(default_factory=dict)
    pass_s: np.ndarray | None = None


class MissingCost:
    """The `StepCost` of a live run given no cost model: a policy that asks for one fails."""

    def step_s(self, ks: Sequence[int], context_tokens: Sequence[int],
               feeds: Sequence[int] | None = None) -> float:
        raise ConfigError(
            "this policy needs a cost model (StepContext.cost): pass LiveEngine(cost=...), e.g. "
            "simulator.StepCostModel of the profile of this device"
        )


class LiveEngine:
    """Serve a workload on `target` with `drafter` and `policy` (see the module doc)."""

    def __init__(
        self,
        target: LlamaModel,
        drafter: Drafter,
        policy: Policy,
        scheduler: SchedulerConfig,
        device: torch.device | str | None = None,
        *,
        cost: StepCost | None = None,
        kv_capacity_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        replay: SpeculationTrace | None = None,
    ) -> None:
        if type(policy).simulation_only:
            raise ConfigError(
                f"policy {policy.name!r} needs an oracle's lookahead: simulation only"
            )
        if scheduler_class(scheduler.scheduler).plans_whole_step:
            raise ConfigError(
                f"scheduler {scheduler.scheduler!r} is simulation only: the live engine runs "
                "fcfs-reserve's calls; compare it with a vLLM server instead"
            )
        if not (temperature >= 0 and temperature < float("inf")):
            raise ConfigError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if drafter.tree is not None and (temperature > 0 or replay is not None):
            raise ConfigError(f"drafter {drafter.name!r} drafts a tree, verified greedily only: "
                              f"run it at temperature 0 and without replay")
        if replay is not None and temperature > 0:
            raise ConfigError("replay takes acceptance from the speculation trace (sampled or "
                              "not): leave the temperature at 0")
        capacity = kv_capacity_tokens if kv_capacity_tokens is not None else (
            scheduler.kv_capacity_tokens)
        if capacity is None:
            raise ConfigError("the live engine needs a KV capacity: set kv_capacity_tokens")
        self.device = torch.device(device) if device is not None else target.config.device
        if self.device != target.config.device:
            raise ConfigError(f"target is on {target.config.device}, not on {self.device}")
        draft_model = drafter.model
        if draft_model is not None and draft_model.config.device != self.device:
            raise ConfigError(f"draft model is on {draft_model.config.device}, not {self.device}")
        self.target, self.drafter, self.policy = target, drafter, policy
        self.scheduler = scheduler
        self.kv_capacity_tokens = int(capacity)
        self._plan_memory(draft_model)
        self.cost: StepCost = cost if cost is not None else MissingCost()
        self.temperature, self.seed = float(temperature), int(seed)
        self.replay = replay

    def _plan_memory(self, draft_model) -> None:
        """Size the paged KV pools (CUDA) for what the scheduler may hold before serving: the
        KV capacity, plus a block of rounding and k_max + 1 verify rows per sequence (a model
        drafter's caches hold twice a prompt: twice that). A pool that cannot fit beside the
        weights is one clear line here, never an out-of-memory error mid-run."""
        seqs, k = self.scheduler.max_num_seqs, self.scheduler.k_max
        each = -(-self.kv_capacity_tokens // seqs) + BLOCK_SIZE + k + 1
        try:
            self.target.reserve_pool(seqs, each)
            if draft_model is not None and hasattr(draft_model, "reserve_pool"):
                draft_model.reserve_pool(seqs, 2 * each)
        except KVPoolTooSmall as error:
            raise ConfigError(f"{error} (--kv-capacity-tokens {self.kv_capacity_tokens}, "
                              f"--max-num-seqs {seqs})") from None

    def run(
        self,
        workload: Workload,
        prompts_tokens: Sequence[Sequence[int]],
        realtime: bool = True,
        virtual_time: bool = False,
    ) -> LiveResult:
        """Serve every request of `workload` (prompt = prompts_tokens[i], max tokens = its
        output_tokens; generation ignores end-of-sequence tokens, as the simulator does).

        realtime=False replays arrivals without sleeping: idle gaps are skipped (EngineClock).
        virtual_time=True times every iteration with the cost model instead of the wall clock
        (VirtualClock): the scheduler then decides exactly as the simulator does, step for step.
        The policy is deep-copied, so runs are independent and the caller's object untouched.
        """
        requests = self._requests(workload, prompts_tokens)
        ids, prompt_tokens, output_tokens = (
            workload.request_ids, workload.prompt_tokens, workload.output_tokens)  # fmt: skip
        check_fits(ids, prompt_tokens, output_tokens, self.scheduler, self.kv_capacity_tokens)
        if virtual_time and not hasattr(self.cost, "iteration_s"):
            raise ConfigError("virtual_time needs a simulator cost model: LiveEngine(cost=...)")
        clock = VirtualClock() if virtual_time else EngineClock(realtime)
        policy = copy.deepcopy(self.policy)
        drafter, script = self.drafter, None
        if self.replay is not None:
            script = ReplayScript(self.replay, workload, policy, self._replay_vocab(),
                                  self.scheduler.k_max, self.seed)
            drafter = ReplayDrafter(self.drafter, script)
        started = time.perf_counter()
        loop = ChunkedLoop if self.scheduler.chunked_prefill else LiveLoop
        server = loop(self, policy, clock, requests, drafter, script)
        steps = server.serve()
        pass_s = np.asarray(server.pass_s, dtype=np.float64)
        req_df = server.log.frame(ids, prompt_tokens, output_tokens)
        rows = [(request.request_id, i, *entry) for request in requests
                for i, entry in enumerate(request.log)]
        decode_log = pd.DataFrame(rows, columns=list(DECODE_LOG_COLUMNS), dtype="int64")
        outputs = tuple(tuple(request.output) for request in requests)
        meta = self._meta(workload, realtime, time.perf_counter() - started)
        meta["virtual_time"] = virtual_time
        return LiveResult(req_df, steps, outputs, decode_log, meta, pass_s)

    def _replay_vocab(self) -> int:
        """Replayed tokens must embed in the target and in a draft model (vocabularies of
        random-weight shapes may differ: only their passes' time matters)."""
        vocab = self.target.config.shape.vocab
        draft = self.drafter.model
        return min(vocab, draft.config.shape.vocab) if draft is not None else vocab

    def _requests(self, workload: Workload, prompts: Sequence[Sequence[int]]) -> list[LiveRequest]:
        if len(prompts) != len(workload):
            raise ValueError(f"{len(prompts)} prompts for a workload of {len(workload)} requests")
        vocab = self._replay_vocab() if self.replay is not None else self.target.config.shape.vocab
        arrival = workload.arrival_s - workload.arrival_s[0]
        out = []
        for i, prompt in enumerate(prompts):
            tokens = [int(t) for t in prompt]
            if len(tokens) != int(workload.prompt_tokens[i]):
                raise ValueError(
                    f"request index {i}: {len(tokens)} prompt tokens, but the "
                    f"workload says {int(workload.prompt_tokens[i])}"
                )
            if min(tokens) < 0 or max(tokens) >= vocab:
                raise ValueError(f"request index {i}: token ids must be in 0..{vocab - 1}")
            out.append(
                LiveRequest(
                    i,
                    int(workload.request_ids[i]),
                    float(arrival[i]),
                    tokens,
                    int(workload.output_tokens[i]),
                )
            )
        return out

    def _meta(self, workload: Workload, realtime: bool, wall_s: float) -> dict:
        return {
            "engine": "live",
            "workload": workload.source,
            "requests": len(workload),
            "target": self.target.config.shape.name,
            "dtype": str(self.target.config.dtype).removeprefix("torch."),
            "drafter": self.drafter.name,
            "replay": None if self.replay is None else dict(self.replay.meta),
            "policy": {"name": self.policy.name, "params": self.policy.params()},
            "scheduler": self.scheduler.__dict__,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "device": str(self.device),
            "threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
            "realtime": realtime,
            "temperature": self.temperature,
            "seed": self.seed,
            "wall_s": wall_s,
        }
