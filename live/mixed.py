"""The live engine's iteration with chunked prefill: decode requests and prompt chunks share one
target pass (Sarathi-style mixed batches, vLLM's default).

`ChunkedLoop` is the live loop (live/loop.py) whose `iterate` runs the simulator's rules
(simulator/scheduler.py, as simulator/replica.py's `_mixed_iteration` runs them): the policy chooses
k for the running requests and they draft first; the token budget left after their k + 1 tokens
each goes to the prompts being prefilled (oldest first), then to waiting requests admitted FCFS
while the batch cap and the KV reservation allow; one target pass feeds every decode request's
[last, drafts] and every chunk; a prompt whose last chunk ran emits its first token (argmax, or
a sample, of that chunk's last row, or the replayed sequence's first) at the iteration's end.

A draft model prefills a prompt in one pass of its own when the prompt's last chunk has run (the
simulator's cost model charges chunk tokens to the draft's first chain pass instead: the same
tokens, one pass fewer); an EAGLE drafter gets the prompt's features collected chunk by chunk.
"""

from __future__ import annotations

import torch

from drafters.base import DraftChain
from live.loop import LiveLoop
from live.requests import LiveRequest
from live.verify import FedPass, verify_layouts, verify_tokens

Chunk = tuple[LiveRequest, int, int]  # (request, tokens in this chunk, tokens already cached)


class ChunkedLoop(LiveLoop):
    """The live loop with chunked prefill: decode steps and prompt chunks in one target pass."""

    def plan_chunks(self, decode_tokens: int, now: float) -> list[Chunk]:
        """This iteration's prompt chunks (the scheduler's plan), with a target cache for each
        request it admitted."""
        chunks = self.scheduler.plan_chunks(decode_tokens, now)
        target = self.engine.target
        for request, _, cached in chunks:
            if cached == 0 and request.cache is None:
                request.cache = target.new_cache(request.reserve + 1)
        return chunks

    def iterate(self, start: float) -> None:
        """One iteration of decode steps and prompt chunks (see the module doc)."""
        scheduler = self.scheduler
        batch = list(scheduler.running)
        ks = self.choose(batch) if batch else []
        chains = self.draft(batch, ks) if batch else []
        drafted = [c.depth for c in chains]  # positions: a tree's depth, as the simulator's k
        chunks = self.plan_chunks(sum(len(c) + 1 for c in chains), start)  # tokens verified
        waiting, held, kv = scheduler.snapshot()
        cached = [request.context_tokens - 1 for request in batch]
        fed, chunk_out = self._mixed_pass(batch, chains, chunks)
        results = self.verify(batch, chains, fed) if batch else []
        outcomes = [self.apply(request, k, res) for request, k, res in zip(batch, ks, results)]
        done = self._complete_prompts(chunks, chunk_out)
        n_tokens = sum(n for _, n, _ in chunks)
        prompt_cached = sum(c for _, _, c in chunks)
        pairs = sum(n * c + n * (n + 1) // 2 for _, n, c in chunks)
        feeds = [chain.fed for chain in chains]
        end = self.end_iteration(start, lambda: self.engine.cost.iteration_s(
            drafted, cached, len(chunks), n_tokens, prompt_cached, pairs, feeds))
        scheduler.step_index += 1
        if self.observes and batch:  # after the end, at the end's time, as in the simulator
            self.policy.tell(self.context(batch), outcomes)
        accepted, emitted = sum(o.accepted for o in outcomes), sum(o.emitted for o in outcomes)
        row = (0, start, end - start, len(batch), len(chunks), n_tokens, sum(drafted),
               max(drafted, default=0), accepted, emitted, waiting, held, kv)
        self.steps.add(*row)
        scheduler.start_decoding(done, end)
        self.finish_done(end)

    def _mixed_pass(self, batch: list[LiveRequest], chains: list[DraftChain],
                    chunks: list[Chunk]) -> tuple[FedPass | None, list[tuple]]:
        """The one target pass over the decode requests' verify tokens and the prompt chunks: the
        decode part as a verify pass's result (None without chunks: `verify` runs its own pass),
        and per chunk its last row's logits and (for a drafter that reads them) its features. The
        logits come out of the pass itself, so the engine's pass time holds the LM head too."""
        if not chunks:
            return None, []
        target, device = self.engine.target, self.engine.device
        tokens = verify_tokens([request.tokens[-1] for request in batch], chains, device)
        tokens += [torch.tensor(request.tokens[c : c + n], dtype=torch.int64, device=device)
                   for request, n, c in chunks]
        starts = [request.cache.length for request in batch]
        caches = [request.cache for request in batch] + [request.cache for request, _, _ in chunks]
        want = self.drafter.needs_hidden
        modes = ["all"] * len(batch) + ["last"] * len(chunks)
        layouts = verify_layouts(chains, caches[: len(batch)], device)
        if layouts is not None:
            layouts += [None] * len(chunks)
        if want:
            logits, hidden = target(tokens, caches, logits=modes, features=True, layouts=layouts)
        else:
            logits = target(tokens, caches, logits=modes, layouts=layouts)
            hidden = [None] * len(tokens)
        fed = (starts, logits[: len(batch)], hidden[: len(batch)] if want else None)
        return fed, list(zip(logits[len(batch) :], hidden[len(batch) :]))

    def _complete_prompts(self, chunks: list[Chunk],
                          chunk_out: list[tuple]) -> list[LiveRequest]:
        """Count the chunks; prompts that are now whole get their first token and their drafter
        state (inside the iteration: a draft model's prefill pass is part of its time)."""
        done, last_rows, prompt_hidden = [], [], []
        for (request, n, _), (last, rows) in zip(chunks, chunk_out):
            request.prefilled += n
            if self.drafter.needs_hidden:
                request.prompt_hidden.append(rows)
            if request.prefilled == request.prompt_tokens:
                done.append(request)
                last_rows.append(last)
                hidden = request.prompt_hidden
                prompt_hidden.append(torch.cat(hidden) if hidden else None)
                request.prompt_hidden = []
        if not done:
            return done
        ids = [request.request_id for request in done]
        self.drafter.start(ids, [list(request.tokens) for request in done])
        if self.drafter.needs_hidden:
            self.drafter.observe_hidden(ids, prompt_hidden)
        if self.script is not None:
            firsts = [self.script.first_token(rid) for rid in ids]
        else:
            firsts = self.first_tokens(torch.cat(last_rows))
        for request, token in zip(done, firsts):
            request.tokens.append(token)
        return done
