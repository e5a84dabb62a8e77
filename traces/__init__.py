"""Workloads (request arrivals and lengths) and speculation traces for the spectune simulator.

This package sits at the bottom of spectune's import graph: it depends only on numpy and the
standard library, and importing it does no I/O (built-in traces load on first use).
"""

from traces._atomic import atomic_write
from traces.builtin import DEFAULT_WORKLOAD, builtin_names, builtin_workload
from traces.errors import TraceError, UserNote
from traces.loaders import load_workload, save_workload
from traces.parametric import ParametricAcceptance, parametric_trace, parse_acceptance
from traces.speculation import SIGNALS, RequestSpeculation, SpeculationTrace, run_from_matches
from traces.synthetic import (
    EmpiricalLengths,
    FixedLengths,
    gamma_arrivals,
    parse_lengths,
    poisson_arrivals,
    rescale_to_rate,
    synthetic_workload,
)
from traces.workload import Request, Workload

__all__ = [
    "DEFAULT_WORKLOAD",
    "SIGNALS",
    "EmpiricalLengths",
    "FixedLengths",
    "ParametricAcceptance",
    "Request",
    "RequestSpeculation",
    "SpeculationTrace",
    "TraceError",
    "UserNote",
    "Workload",
    "atomic_write",
    "builtin_names",
    "builtin_workload",
    "gamma_arrivals",
    "load_workload",
    "parametric_trace",
    "parse_acceptance",
    "parse_lengths",
    "poisson_arrivals",
    "rescale_to_rate",
    "run_from_matches",
    "save_workload",
    "synthetic_workload",
]
