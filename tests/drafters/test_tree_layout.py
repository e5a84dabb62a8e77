"""Static draft trees: shapes are checked and ordered, chosen from counted rank paths, saved and
loaded with clear errors; a tree's verify layout gives each node what its own chain would get,
and the accepted path's cache rows move together."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.tiny_models import TINY, sharpened  # noqa: E402

from drafters.tree_layout import accepted_path, tree_layout  # noqa: E402
from models.kv_cache import KVCache  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from simulator.draft_tree import (  # noqa: E402
    TreeShape,
    build_tree,
    chain_shape,
    is_chain,
    load_tree,
    path_counts,
    save_tree,
)

SHAPE = TreeShape(((1,), (0, 0), (0,), (0, 1), (1, 0), (0, 0, 0)))


def test_a_shape_is_breadth_first_and_knows_its_parents_depth_and_runs():
    assert SHAPE.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert SHAPE.parents == [-1, -1, 0, 0, 1, 2]
    assert SHAPE.depth == 3 and len(SHAPE) == 6
    assert SHAPE.upto(1).paths == ((0,), (1,)) and SHAPE.upto(0) is None
    assert SHAPE.run([0, 0, 0, 0]) == 3  # the tree is 3 deep
    assert SHAPE.run([1, 0, 5]) == 2 and SHAPE.run([0, 2, 0]) == 1 and SHAPE.run([3]) == 0
    assert is_chain(chain_shape(3)) and not is_chain(SHAPE)


@pytest.mark.parametrize(("paths", "message"), [
    ((), "at least one node"),
    (((0,), (0,)), "twice"),
    (((0,), (1, 0)), "no parent"),
    (((0,), (-1,)), "ranks >= 0"),
])
def test_a_bad_shape_says_what_is_wrong(paths, message):
    with pytest.raises(ValueError, match=message):
        TreeShape(paths)


def test_the_most_frequent_paths_make_a_prefix_closed_tree():
    ranks = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0], [1, 0, 9], [2, 5, 5]])
    counts = path_counts([ranks], 3)  # row 0 (the prefill's position) is never drafted
    assert counts[(0,)] == 3 and counts[(0, 0)] == 2 and counts[(1,)] == 1
    tree = build_tree(counts, 4, 3, max_rank=8)
    assert tree.paths == ((0,), (1,), (2,), (0, 0))  # ties: the shallower, then smaller ranks
    assert build_tree(counts, 2, 3, max_rank=1).paths == ((0,), (0, 0))
    big = build_tree(Counter({(0,): 5, (0, 0): 4, (0, 0, 0): 3, (1,): 1}), 10, 2, 8)
    assert big.paths == ((0,), (1,), (0, 0))  # depth 2 at most, and no more paths than counted


def test_trees_round_trip_and_a_bad_file_gets_a_clear_error(tmp_path):
    path = tmp_path / "tree.json"
    save_tree(SHAPE, path, {"nodes": 6})
    shape, meta = load_tree(path)
    assert shape == SHAPE and meta == {"nodes": 6}
    with pytest.raises(ValueError, match="no such file"):
        load_tree(tmp_path / "missing.json")
    path.write_text(json.dumps({"paths": [[0], [1, 1]]}))
    with pytest.raises(ValueError, match=r"not a tree file.*no parent"):
        load_tree(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"scripts/eagle_tree\.py"):
        load_tree(path)


def test_the_accepted_path_follows_the_targets_argmax_through_the_tree():
    parents, tokens = SHAPE.parents, [7, 8, 5, 6, 9, 4]
    # best[0]: after the root; best[1 + j]: after node j
    assert accepted_path(parents, tokens, [8, 0, 9, 0, 0, 0, 0]) == [1, 4]
    assert accepted_path(parents, tokens, [7, 5, 0, 4, 0, 0, 1]) == [0, 2, 5]
    assert accepted_path(parents, tokens, [3, 5, 9, 4, 0, 0, 1]) == []


def test_a_verify_pass_over_a_tree_gives_each_node_its_own_chains_logits():
    """Every node's logits in one tree pass equal those of feeding its root-to-node path alone
    after the same cache (positions by depth, siblings unseen)."""
    model = sharpened(LlamaModel.random(config_for(TINY), seed=0))
    rng = np.random.default_rng(3)
    prefix = torch.tensor(rng.integers(0, TINY.vocab, 11))
    tokens = [int(t) for t in rng.integers(0, TINY.vocab, len(SHAPE) + 1)]  # root + nodes
    cache = model.new_cache(64)
    model([prefix], [cache])
    layout = tree_layout(SHAPE.parents, cache.length)
    tree_logits = model([torch.tensor(tokens)], [cache], layouts=[layout])[0]
    for node, path in enumerate(SHAPE.paths):
        rows, j = [1 + node], node
        while SHAPE.parents[j] >= 0:
            j = SHAPE.parents[j]
            rows.insert(0, 1 + j)
        alone = model.new_cache(64)
        model([prefix], [alone])
        chain = model([torch.tensor([tokens[0], *(tokens[r] for r in rows)])], [alone])[0]
        torch.testing.assert_close(tree_logits[1 + node], chain[-1], rtol=1e-4, atol=1e-4)
        assert len(rows) == len(path)


def test_keep_moves_the_accepted_rows_together():
    cache = KVCache(2, 1, 4, capacity=16)
    cache.fill_random_(10)
    before = [k.clone() for k in cache.keys]
    cache.keep(4, [0, 2, 5])
    assert cache.length == 7
    for layer, k in enumerate(cache.keys):
        torch.testing.assert_close(k[:, :5], before[layer][:, :5])
        torch.testing.assert_close(k[:, 5], before[layer][:, 6])
        torch.testing.assert_close(k[:, 6], before[layer][:, 9])
    with pytest.raises(ValueError, match="ascend"):
        cache.keep(4, [2, 1])
