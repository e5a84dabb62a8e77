"""Static draft trees: which of the head's candidates to draft at each depth, and what a step
that drafts one costs.

A tree also drafts the head's runners-up, so a miss of the top-1 is often caught by another
candidate, and the target verifies every branch in one pass (EAGLE, Li et al. 2024, arXiv
2401.15077). A node is its rank path (r_1, .., r_d), the r_d-th most likely child of (r_1, ..,
r_{d-1}); the shape is static: the nodes most often on the target's greedy path in training-split
recordings (`build_tree`, scripts/eagle_tree.py). Nodes are breadth-first, so `upto(k)` is a
prefix and the policy's k is the tree's depth; what differs from a chain of k is the cost
(simulator/step_cost.py). Why one greedy pass scores any shape, and the cost pass by pass:
docs/step-cost.md "Draft trees".
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

Path_ = tuple[int, ...]


@dataclass(frozen=True)
class TreeShape:
    """A prefix-closed set of rank paths, breadth-first; see the module doc."""

    paths: tuple[Path_, ...]

    def __post_init__(self) -> None:
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        if not paths:
            raise ValueError("a draft tree needs at least one node")
        if len(set(paths)) != len(paths):
            raise ValueError("a draft tree names a node twice")
        known = set(paths)
        for p in paths:
            if not p or min(p) < 0:
                raise ValueError(f"tree node {list(p)}: a rank path is a non-empty list of "
                                 f"ranks >= 0")
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"tree node {list(p)} has no parent {list(p[:-1])} in the tree")
        object.__setattr__(self, "paths", tuple(sorted(paths, key=lambda p: (len(p), p))))

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.paths[-1])

    @property
    def parents(self) -> list[int]:
        """Each node's parent as an index into `paths` (-1: the root, the last committed token)."""
        index = {p: i for i, p in enumerate(self.paths)}
        return [index[p[:-1]] if len(p) > 1 else -1 for p in self.paths]

    # Tables worked out once per shape: engines ask for them every step.

    @cached_property
    def _known(self) -> frozenset[Path_]:
        return frozenset(self.paths)

    @cached_property
    def _children(self) -> dict[Path_, tuple[int, ...]]:
        """Each node's (and the root's, ()) children's ranks, ascending."""
        children: dict[Path_, list[int]] = {}
        for p in self.paths:
            children.setdefault(p[:-1], []).append(p[-1])
        return {parent: tuple(sorted(ranks)) for parent, ranks in children.items()}

    @cached_property
    def _nodes_upto(self) -> list[int]:
        """[k]: the nodes of depth <= k, k = 0 .. depth."""
        counts = np.bincount([len(p) for p in self.paths], minlength=self.depth + 1)
        return np.cumsum(counts).tolist()

    @cached_property
    def _pairs_upto(self) -> list[int]:
        """[k]: `verify_pairs(k)`, k = 0 .. depth."""
        counts = np.bincount([len(p) for p in self.paths], minlength=self.depth + 1)
        return (1 + np.cumsum(counts * np.arange(1, self.depth + 2))).tolist()

    @cached_property
    def _expanding(self) -> list[int]:
        """[d]: the nodes of depth d with children, d = 0 .. depth (0: the root)."""
        return np.bincount([len(parent) for parent in self._children],
                           minlength=self.depth + 1).tolist()

    @cached_property
    def _uptos(self) -> dict[int, TreeShape | None]:
        return {}

    def child_ranks(self, path: Path_) -> tuple[int, ...]:
        """The ranks of `path`'s children (() for the root's), ascending; () for a leaf."""
        return self._children.get(tuple(path), ())

    def draft_tokens(self, k: int) -> int:
        """Nodes of depth <= k: the draft tokens a verify pass at depth k feeds."""
        return self._nodes_upto[min(max(k, 0), self.depth)]

    def expanding(self, depth: int) -> int:
        """Nodes of `depth` with children (depth 0: the root), each one entry of the head's
        pass that drafts depth + 1."""
        return self._expanding[depth] if 0 <= depth <= self.depth else 0

    def verify_pairs(self, k: int) -> int:
        """Attention pairs among the new rows of a verify pass at depth k: the root sees itself,
        a node of depth d itself, its d - 1 ancestors and the root (a chain's (k+1)(k+2)/2)."""
        return self._pairs_upto[min(max(k, 0), self.depth)]

    def upto(self, depth: int) -> TreeShape | None:
        """The nodes of depth <= `depth` (None for depth 0: nothing to draft); one object per
        depth, so the tables above are worked out once."""
        depth = min(depth, self.depth)
        if depth not in self._uptos:
            kept = tuple(p for p in self.paths if len(p) <= depth)
            self._uptos[depth] = (self if depth == self.depth
                                  else TreeShape(kept) if kept else None)
        return self._uptos[depth]

    def run(self, ranks: Sequence[int]) -> int:
        """How deep the tree follows a greedy path whose true token has these ranks by depth."""
        depth = 0
        while depth < len(ranks) and tuple(int(r) for r in ranks[: depth + 1]) in self._known:
            depth += 1
        return depth

    def to_json(self) -> list[list[int]]:
        return [list(p) for p in self.paths]


def is_chain(shape: TreeShape) -> bool:
    return all(set(p) == {0} for p in shape.paths)


def chain_shape(depth: int) -> TreeShape:
    return TreeShape(tuple((0,) * d for d in range(1, depth + 1)))


def path_counts(ranks: Iterable[np.ndarray], depth: int) -> Counter:
    """How often each rank path (up to `depth`) lies on the greedy path: ranks[t, d] is the rank
    of the true token at depth d + 1 of the chain from output position t (rows from t = 1)."""
    counts: Counter = Counter()
    for r in ranks:
        for row in np.asarray(r)[1:, :depth]:
            for d in range(1, depth + 1):
                counts[tuple(int(x) for x in row[:d])] += 1
    return counts


def build_tree(counts: Counter, nodes: int, depth: int, max_rank: int) -> TreeShape:
    """The `nodes` most frequent paths of depth <= `depth` with every rank < `max_rank` (a
    path is never more frequent than its parent, so the set is prefix-closed: ties go to the
    shallower path, then the smaller ranks)."""
    if nodes < 1 or depth < 1:
        raise ValueError(f"a tree needs nodes >= 1 and depth >= 1, got {nodes} and {depth}")
    wanted = sorted((p for p in counts if len(p) <= depth and max(p) < max_rank),
                    key=lambda p: (-counts[p], len(p), p))
    chosen: set[Path_] = set()
    for p in wanted:
        if len(chosen) == nodes:
            break
        if len(p) == 1 or p[:-1] in chosen:
            chosen.add(p)
    return TreeShape(tuple(chosen))


def save_tree(shape: TreeShape, path: Path, meta: dict) -> None:
    from traces import atomic_write

    head = json.dumps({"meta": meta}, indent=1)[:-2]  # without its closing "\n}"
    paths = ",\n  ".join(json.dumps(p) for p in shape.to_json())
    text = f'{head},\n "paths": [\n  {paths}\n ]\n}}\n'  # one node per line
    with atomic_write(path) as handle:
        handle.write(text.encode())


def load_tree(path: Path) -> tuple[TreeShape, dict]:
    """A tree file (`save_tree`); a clear error for a file that is not one."""
    try:
        data = json.loads(Path(path).read_text())
        return TreeShape(tuple(tuple(p) for p in data["paths"])), dict(data.get("meta", {}))
    except FileNotFoundError:
        raise ValueError(f"draft tree {path}: no such file") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"draft tree {path}: not a tree file ({error}); write one with "
                         f"scripts/eagle_tree.py") from None


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 for a child of the root); parents come before their children."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths
