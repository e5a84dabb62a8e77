"""How the live engine lays out a draft tree (simulator/draft_tree.py: its shape, what it costs)
in one pass: each node at the position of its depth, seeing only its ancestors; and which of its
nodes greedy verification accepts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.eagle_head import SHIPPED_HEAD
from models.kv_cache import RowLayout
from simulator.draft_tree import TreeShape, node_depths

#: The shipped head's tree (scripts/eagle_tree.py; its meta says how it was chosen).
SHIPPED_TREE = SHIPPED_HEAD.with_name("smollm2-135m-eagle-tree.json")

__all__ = ["SHIPPED_TREE", "TreeShape", "accepted_path", "ancestor_mask", "first_child",
           "tree_layout"]


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """[n + 1, n + 1] bool: row i (0 = the root, 1 + j = node j) sees itself and its ancestors."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    mask[0, 0] = True
    for j, parent in enumerate(parents):
        row = 1 + j
        if parent >= 0:
            mask[row] = mask[1 + parent]
        mask[row, row] = True
    return mask


def tree_layout(parents: Sequence[int], cached: int, device=None) -> RowLayout:
    """How a verify pass feeds [last, nodes..] after `cached` tokens: the root at position
    `cached`, a node at `cached` + its depth; every row sees the cache, itself and its
    ancestors."""
    depths = node_depths(parents)
    positions = torch.tensor([cached, *(cached + d for d in depths)], device=device)
    tree = ancestor_mask(parents)
    mask = torch.cat((torch.ones(tree.shape[0], cached, dtype=torch.bool), tree), dim=1)
    return RowLayout(positions, mask.to(device), cached + max(depths, default=0) + 1)


def accepted_path(parents: Sequence[int], tokens: Sequence[int], best: Sequence[int]) -> list[int]:
    """The nodes greedy verification accepts: from the root, the child whose token is the
    target's argmax after the path so far (`best[0]` after the root, `best[1 + j]` after node
    j), while there is one."""
    children: dict[int, dict[int, int]] = {}
    for j, (parent, token) in enumerate(zip(parents, tokens)):
        children.setdefault(parent, {}).setdefault(int(token), j)
    path, node = [], -1
    while True:
        child = children.get(node, {}).get(int(best[node + 1]))
        if child is None:
            return path
        path.append(child)
        node = child


def first_child(parents: Sequence[int], node: int) -> int | None:
    """The first (most likely) child of `node` (-1: the root), or None for a leaf."""
    return next((j for j, parent in enumerate(parents) if parent == node), None)
