"""Speculation-length policies: vocabulary, protocol, registry, and one module per policy.

Every module in this package that is not part of the framework registers its policy on import;
importing the package imports them all, so adding a policy is adding one module.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from policies.base import (
    DraftOutcome,
    HeldSteps,
    Policy,
    PolicyError,
    RequestView,
    RequestWalker,
    StepContext,
    StepCost,
    StepOutcomes,
)
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

_FRAMEWORK = {"base", "compiled", "kernels", "registry", "vocabulary"}
for _module in _pkgutil.iter_modules(__path__):
    if _module.name not in _FRAMEWORK and not _module.name.startswith("_"):
        _importlib.import_module(f"policies.{_module.name}")

__all__ = [
    "DraftOutcome",
    "HeldSteps",
    "ParamInfo",
    "Policy",
    "PolicyError",
    "RequestView",
    "RequestWalker",
    "StepContext",
    "StepCost",
    "StepOutcomes",
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
