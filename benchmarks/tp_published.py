"""The tensor-parallel roofline against published 70B decode steps on H100 SXM at TP 1-8.

No multi-GPU machine is available to the project, so the model's TP cost (weights, KV and FLOPs
split N ways, two ring all-reduces per layer: docs/tensor-parallel.md) is checked against
decode-step times that engines published for Llama-70B on H100 SXM (NVLink 4 via NVSwitch).
Each row is one published configuration; the model prices the same decode step (batch B, each
sequence at the mean context of the run's decode: input + output / 2; fp8 runs as 1-byte weights
and KV) and the table prints both and the error. The sources and what each figure means:

  [A] TensorRT-LLM 0.9.0 static-batch benchmark, Llama-2-70B, H100 80GB HBM3, custom all-reduce
      on: "Token-to-token Latency (ms)" = (latency - first-token latency) / (output - 1), a pure
      decode step. A copy of NVIDIA's cluster-sizing course data: GitHub
      wbing520/ai-performance-engineering, code/ch11_inference/inference_gpu_cluster_sizing/
      dataset/trt_llm_0_9_0_dli.csv.
  [B] NVIDIA NIM (TensorRT-LLM backend) swept with GenAI-Perf, Llama-3-70B-Instruct, H100 80GB
      HBM3: mean inter-token latency at concurrency 1 (a batch-1 decode step plus the server's
      streaming). Same repository, code/ch10_inference/inference_gpu_cluster_sizing/dataset/
      nim.csv (NIM version not stated).
  [C] NVIDIA NIM 1.8.0 benchmarking docs, Llama-3.3-70B-Instruct, 2 x H100 80G, fp8, TP 2: ITL at
      concurrency 1 (docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance).
  [D] SGLang pull request 4716, Llama-3.3-70B-Instruct, H100, TP 8, fp16, batch 1 without
      speculation: 88.61 tokens/s over MT-bench (TTFT included: a slight over-estimate of the
      step).

    python benchmarks/tp_published.py [--fit]
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, replace

from simulator import RooflineLatency, StepCostModel, get_gpu, get_model
from simulator.roofline import RooflineParams


@dataclass(frozen=True)
class Published:
    """One published decode step: where, what, and the figure in milliseconds."""

    source: str
    model: str
    tp: int
    dtype: str  # fp8 or fp16
    batch: int
    input_tokens: int
    output_tokens: int
    step_ms: float


PUBLISHED = (
    Published("A", "Llama-2-70B", 1, "fp8", 1, 128, 128, 27.04),
    Published("A", "Llama-2-70B", 2, "fp8", 1, 128, 128, 17.27),
    Published("A", "Llama-2-70B", 4, "fp8", 1, 128, 128, 12.03),
    Published("A", "Llama-2-70B", 4, "fp16", 1, 128, 128, 17.48),
    Published("A", "Llama-2-70B", 8, "fp8", 2, 2048, 128, 10.43),
    Published("A", "Llama-2-70B", 2, "fp16", 1, 2048, 128, 29.56),
    Published("A", "Llama-2-70B", 2, "fp8", 8, 128, 2048, 19.00),
    Published("A", "Llama-2-70B", 2, "fp16", 8, 128, 2048, 30.12),
    Published("A", "Llama-2-70B", 4, "fp8", 4, 2048, 2048, 13.73),
    Published("A", "Llama-2-70B", 8, "fp8", 16, 128, 2048, 10.84),
    Published("A", "Llama-2-70B", 8, "fp16", 8, 2048, 2048, 15.16),
    Published("A", "Llama-2-70B", 8, "fp8", 32, 2048, 2048, 15.36),
    Published("A", "Llama-2-70B", 8, "fp8", 32, 128, 4096, 14.20),
    Published("A", "Llama-2-70B", 2, "fp8", 32, 128, 4096, 21.62),
    Published("A", "Llama-2-70B", 4, "fp16", 128, 128, 128, 24.93),
    Published("A", "Llama-2-70B", 4, "fp8", 96, 2048, 128, 22.87),
    Published("A", "Llama-2-70B", 4, "fp8", 512, 128, 128, 37.73),
    Published("A", "Llama-2-70B", 4, "fp16", 512, 128, 128, 46.72),
    Published("A", "Llama-2-70B", 2, "fp8", 512, 128, 128, 50.54),
    Published("A", "Llama-2-70B", 2, "fp8", 1024, 128, 128, 89.97),
    Published("A", "Llama-2-70B", 8, "fp8", 640, 128, 4096, 50.61),
    Published("B", "Llama-3.1-70B", 4, "fp8", 1, 200, 200, 13.73),
    Published("B", "Llama-3.1-70B", 8, "fp8", 1, 200, 200, 12.00),
    Published("B", "Llama-3.1-70B", 4, "fp16", 1, 200, 200, 18.83),
    Published("B", "Llama-3.1-70B", 8, "fp16", 1, 200, 200, 14.22),
    Published("B", "Llama-3.1-70B", 4, "fp8", 1, 2000, 2000, 16.04),
    Published("B", "Llama-3.1-70B", 8, "fp8", 1, 2000, 2000, 14.30),
    Published("B", "Llama-3.1-70B", 4, "fp16", 1, 2000, 2000, 20.63),
    Published("B", "Llama-3.1-70B", 8, "fp16", 1, 2000, 2000, 16.01),
    Published("B", "Llama-3.1-70B", 4, "fp8", 1, 7000, 1000, 19.46),
    Published("B", "Llama-3.1-70B", 8, "fp8", 1, 7000, 1000, 17.57),
    Published("B", "Llama-3.1-70B", 4, "fp16", 1, 7000, 1000, 23.73),
    Published("B", "Llama-3.1-70B", 8, "fp16", 1, 7000, 1000, 19.11),
    Published("C", "Llama-3.1-70B", 2, "fp8", 1, 5000, 500, 18.58),
    Published("C", "Llama-3.1-70B", 2, "fp8", 1, 500, 2000, 18.91),
    Published("D", "Llama-3.1-70B", 8, "fp16", 1, 100, 250, 11.29),
)
#: [B] served Llama-3-70B, [C] and [D] Llama-3.3-70B: the same shape as the catalog's Llama-3.1-70B
DTYPE_BYTES = {"fp8": 1, "fp16": 2}


def modelled_ms(row: Published, params: RooflineParams) -> float:
    """The model's decode step for the row: B sequences at the run's mean decode context."""
    latency = RooflineLatency(get_model(row.model), None, get_gpu("H100-SXM"),
                              dtype_bytes=DTYPE_BYTES[row.dtype], params=params, tp=row.tp)
    context = row.input_tokens + row.output_tokens // 2
    return 1e3 * StepCostModel(latency).step_s([0] * row.batch, [context] * row.batch)


def errors(rows, params: RooflineParams) -> list[float]:
    """Per row, the model's error against the published step, in percent."""
    return [(modelled_ms(row, params) - row.step_ms) / row.step_ms * 100 for row in rows]


def fit(rows) -> tuple[float, float]:
    """The all-reduce point's fixed cost (a part + a part per further GPU, in seconds) that
    minimises the median absolute error over `rows`, on a grid of 0.5 us x 0.25 us steps."""
    zero = replace(RooflineParams(), allreduce_latency_s=0.0, allreduce_latency_per_gpu_s=0.0)
    base = [modelled_ms(row, zero) for row in rows]
    calls = [0 if row.tp == 1 else 2 * get_model(row.model).layers for row in rows]
    best = (math.inf, 0.0, 0.0)
    for fixed_us in range(0, 121):  # 0 to 60 us
        for per_gpu_us in range(0, 61):  # 0 to 15 us
            fixed, per_gpu = fixed_us * 0.5e-6, per_gpu_us * 0.25e-6
            errs = [abs(b + 1e3 * n * (fixed + per_gpu * (row.tp - 1)) - row.step_ms)
                    / row.step_ms for row, b, n in zip(rows, base, calls)]
            score = statistics.median(errs)
            if score < best[0]:
                best = (score, fixed, per_gpu)
    return best[1], best[2]


def summary(label: str, rows, errs: list[float]) -> str:
    by_tp = "; ".join(
        f"TP {tp}: {statistics.median(e for r, e in zip(rows, errs) if r.tp == tp):+.1f}%"
        for tp in sorted({r.tp for r in rows}))
    return (f"| {label} | {len(rows)} | {statistics.median(errs):+.1f}% | "
            f"{statistics.median(abs(e) for e in errs):.1f}% | {by_tp} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true",
                        help="also fit the all-reduce point's cost on source A (TP > 1) and "
                             "report it on the held-out sources B, C and D")
    args = parser.parse_args()
    params = RooflineParams()
    datasheet = replace(params, allreduce_latency_s=6e-6, allreduce_latency_per_gpu_s=0.0)
    errs, before = errors(PUBLISHED, params), errors(PUBLISHED, datasheet)
    print(f"H100-SXM, NVLink 4 via NVSwitch; all-reduce point {params.allreduce_latency_s * 1e6:g}"
          f" us + {params.allreduce_latency_per_gpu_s * 1e6:g} us per further GPU (the "
          "defaults), beside 6 us flat (a measured small all-reduce alone)")
    print("| source | model | TP | dtype | batch | in / out | published ms | model ms | error "
          "| error at 6 us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row, err, old in zip(PUBLISHED, errs, before):
        print(f"| {row.source} | {row.model} | {row.tp} | {row.dtype} | {row.batch} | "
              f"{row.input_tokens} / {row.output_tokens} | {row.step_ms:.2f} | "
              f"{modelled_ms(row, params):.2f} | {err:+.1f}% | {old:+.1f}% |")
    print()
    print("| setting | rows | median error | median abs error | median error by TP |")
    print("|---|---|---|---|---|")
    print(summary("defaults", PUBLISHED, errs))
    print(summary("6 us flat", PUBLISHED, before))
    if args.fit:
        train = [r for r in PUBLISHED if r.source == "A" and r.tp > 1]
        held = [r for r in PUBLISHED if r.source != "A" and r.tp > 1]
        fixed, per_gpu = fit(train)
        fitted = replace(params, allreduce_latency_s=fixed, allreduce_latency_per_gpu_s=per_gpu)
        print()
        print(f"fitted on source A, TP > 1 ({len(train)} rows): {fixed * 1e6:g} us + "
              f"{per_gpu * 1e6:g} us per further GPU")
        print("| rows | count | median error | median abs error | median error by TP |")
        print("|---|---|---|---|---|")
        print(summary("fitted on (A)", train, errors(train, fitted)))
        print(summary("held out (B, C, D)", held, errors(held, fitted)))


if __name__ == "__main__":
    main()
