"""The serving simulator: catalog, latency models, acceptance replay, SimPy engine, metrics.

Names load on first use: `from simulator import SchedulerConfig` imports simulator.config alone,
and only `simulate`, `summarize`, `Slo` and `SimulationResult` bring in the engine (SimPy,
pandas), so a command line that only builds its flags stays quick to start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.catalog import (
        GpuSpec,
        ModelShape,
        get_gpu,
        get_model,
        gpu_names,
        kv_capacity_tokens,
        model_names,
    )
    from simulator.config import ClusterConfig, SchedulerConfig
    from simulator.engine import SimulationResult, simulate
    from simulator.errors import ConfigError
    from simulator.latency import LatencyModel, attention_pairs
    from simulator.metrics import Slo, summarize
    from simulator.roofline import RooflineLatency
    from simulator.step_cost import StepCostModel

#: where each name of __all__ is defined (simulator.<module>)
_HOMES = {
    "ClusterConfig": "config",
    "ConfigError": "errors",
    "GpuSpec": "catalog",
    "LatencyModel": "latency",
    "ModelShape": "catalog",
    "RooflineLatency": "roofline",
    "SchedulerConfig": "config",
    "SimulationResult": "engine",
    "Slo": "metrics",
    "StepCostModel": "step_cost",
    "attention_pairs": "latency",
    "get_gpu": "catalog",
    "get_model": "catalog",
    "gpu_names": "catalog",
    "kv_capacity_tokens": "catalog",
    "model_names": "catalog",
    "simulate": "engine",
    "summarize": "metrics",
}

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "GpuSpec",
    "LatencyModel",
    "ModelShape",
    "RooflineLatency",
    "SchedulerConfig",
    "SimulationResult",
    "Slo",
    "StepCostModel",
    "attention_pairs",
    "get_gpu",
    "get_model",
    "gpu_names",
    "kv_capacity_tokens",
    "model_names",
    "simulate",
    "summarize",
]


def __getattr__(name: str) -> object:
    """Import a public name's module on first use (and keep the name here for the next)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"simulator.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
