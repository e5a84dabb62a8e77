"""Speculation-length policies: vocabulary, protocol, registry, and one module per policy."""

from policies import fixed as _fixed  # noqa: F401  (registers the policy)
from policies.base import DraftOutcome, Policy, PolicyError, RequestView, StepContext, StepCost
from policies.registry import (
    ParamInfo,
    make_policy,
    parameters,
    policy_class,
    policy_names,
    register,
)
from policies.vocabulary import (
    alpha_from_mean_accepted,
    expected_accepted,
    expected_emitted,
    speedup,
)

__all__ = [
    "DraftOutcome",
    "ParamInfo",
    "Policy",
    "PolicyError",
    "RequestView",
    "StepContext",
    "StepCost",
    "alpha_from_mean_accepted",
    "expected_accepted",
    "expected_emitted",
    "make_policy",
    "parameters",
    "policy_class",
    "policy_names",
    "register",
    "speedup",
]
