"""--policies lists: commas inside brackets belong to a value (vLLM's per-batch-size tables)."""

from __future__ import annotations

import pytest

from spectune.flags import parse_policy_list


def test_a_table_value_keeps_its_commas():
    got = parse_policy_list("fixed:k=0, batch_adaptive:schedule=[[1,4,4],[5,128,0]],goodput")
    assert got == [("fixed:k=0", "fixed", {"k": "0"}),
                   ("batch_adaptive:schedule=[[1,4,4],[5,128,0]]", "batch_adaptive",
                    {"schedule": "[[1,4,4],[5,128,0]]"}),
                   ("goodput", "goodput", {})]
    assert [label for label, _, _ in parse_policy_list("a:x=[1,[2,3]],b")] == ["a:x=[1,[2,3]]",
                                                                              "b"]


def test_a_pair_without_a_value_is_named():
    with pytest.raises(ValueError, match="'fixed:4': write NAME:KEY=VALUE"):
        parse_policy_list("fixed:4")
