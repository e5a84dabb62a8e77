"""The serving simulator: catalog, latency models, acceptance replay, SimPy engine, metrics."""

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
