"""The drafter interface: what the live engine asks of any drafter, and what a chain carries.

A drafter proposes, for every request of a batch, a greedy chain of up to k_r tokens after the
request's token history (prompt + generated). After each proposed token the engine's stop rule
(the policy's `stop_drafting`) may end that request's chain; the token is kept. The chain ends at
k_r, at a stop, or (n-gram) when the lookup has nothing more to propose, so a chain may be shorter
than k_r: the engine verifies and records what was actually drafted.

Drafters keep whatever state they need per request (a model drafter: a KV cache) and re-sync it
from the history at each `propose`, so the engine never has to report acceptances back: whatever
the drafter fed that the history no longer agrees with (rejected drafts) is rolled back then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from simulator.draft_tree import TreeShape, node_depths

#: (row of the request in the batch, depth of the token in its chain, draft top-1, entropy) -> stop
StopRule = Callable[[int, int, float, float], bool]


@dataclass
class DraftChain:
    """One request's proposals in one step, with what the draft knew about each.

    `probs` [len, vocab] holds the draft's distribution at each proposed position (model drafters,
    when the caller asked for it: KL and acceptance probability need it); None otherwise.
    `fed`: tokens the chain's first draft pass fed per request, its catch-up on the history
    (simulator/draft_feed.py says how many the simulator charges); 0 for model-free drafters.
    """

    tokens: list[int] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    probs: torch.Tensor | None = None
    fed: int = 0
    #: a draft tree (drafters/tree_layout.py): each token's parent, an index into `tokens` (-1:
    #: the request's last committed token), parents first; None for a chain. A node's top1,
    #: entropy and probs are those of the distribution it was drawn from (its parent's).
    parents: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """Positions drafted: a chain's length, a tree's deepest node (what k counts)."""
        if self.parents is None:
            return len(self.tokens)
        return max(node_depths(self.parents), default=0)


class Drafter:
    """What the live engine needs of a drafter. `model_free` drafters cost no model pass."""

    name: str = ""
    model_free: bool = False
    #: The engine hands it the target's features of committed tokens (`observe_hidden`): EAGLE.
    needs_hidden: bool = False
    #: What its first draft pass feeds (simulator/draft_feed.py): a draft model's cache keeps the
    #: drafts it fed ("bonus"); EAGLE re-feeds everything committed since its last chain.
    catch_up: str = "bonus"
    #: The module whose passes drafting runs (a draft model, an EAGLE head): the engine checks
    #: its device and times its passes. None for a model-free drafter.
    model: torch.nn.Module | None = None
    #: The draft tree it drafts instead of chains (simulator/draft_tree.py); None: chains.
    tree: TreeShape | None = None

    @property
    def timing_model(self) -> torch.nn.Module | None:
        """What a profile sweep calls like a draft model to time one draft pass: `model`, unless
        its passes are timed another way (an EAGLE head's `HeadTiming`)."""
        return self.model

    def start(self, request_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """New requests were prefilled by the target (model drafters prefill them too)."""

    def propose(
        self,
        request_ids: Sequence[int],
        histories: Sequence[Sequence[int]],
        ks: Sequence[int],
        stop: StopRule | None = None,
        keep_probs: bool = False,
    ) -> list[DraftChain]:
        """Greedy chains of at most ks[i] tokens after histories[i] (k = 0: an empty chain)."""
        raise NotImplementedError

    def observe_hidden(self, request_ids: Sequence[int], hidden: Sequence[torch.Tensor]) -> None:
        """The target's last-layer outputs (before the final norm) [n_r, hidden] of the tokens it
        just committed per request: a prefill's prompt, or a verify pass's fed token and its
        accepted drafts. Called only for drafters that set `needs_hidden`."""

    def finish(self, request_id: int) -> None:
        """The request left: drop its state."""
