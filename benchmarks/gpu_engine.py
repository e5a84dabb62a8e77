"""The engine's pass times against the memory floor measured in the same run (docs/gpu-engine.md).

For a target at one context (default Llama-3.1-8B, bf16, 1024 tokens): decode at several batch
sizes, a verify of 5 tokens at batch 16, and a draft model's decode at batch 1, each timed for
every engine variant side by side:

- per-request: a KV cache per request, attention per request (the engine before the pool);
- paged-eager: the paged pool, gather + one SDPA per layer, no graphs;
- paged-graphs: the same replayed as CUDA graphs;
- triton-unpadded: the paged Triton kernel, replayed as CUDA graphs, rows not padded;
- triton-graphs: the same with a graph's rows padded to a multiple of 16;
- compiled: and the layer's parts around attention through torch.compile (the CUDA default).

The floor of a pass is the bytes it must read once (every weight, every cached K/V row it
attends to) over the copy bandwidth measured here. CUDA events around each call (host work
included, as the engine pays it), medians of `--repeats` calls after warm-up. On a CPU the
graph variants are skipped (a tiny shape checks the script end to end).

    python benchmarks/gpu_engine.py --out runs/gpu-engine
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.llama import LlamaModel, config_for
from models.paged_kv import BLOCK_SIZE, KVPool
from profiler.timing import time_call
from simulator.catalog import get_model

VARIANTS = {  # name: (paged, backend, graphs, compiled, graph row multiple)
    "per-request": (False, "torch", False, False, 16),
    "paged-eager": (True, "torch", False, False, 16),
    "paged-graphs": (True, "torch", True, False, 16),
    "triton-unpadded": (True, "triton", True, False, 1),
    "triton-graphs": (True, "triton", True, False, 16),
    "compiled": (True, "triton", True, True, 16),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class PassSpec:
    name: str
    role: str  # "target" or "draft"
    batch: int
    query: int


def copy_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes per second of a large device-to-device copy, read plus written."""
    src = torch.randn(mib * 2**20 // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, warmup=3, repeats=10)
    return 2 * src.numel() * src.element_size() / timing.median_s


def weight_bytes(model: LlamaModel) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(model: LlamaModel) -> int:
    s = model.config.shape
    return s.layers * 2 * s.kv_heads * s.head_dim * model.config.dtype.itemsize


def configure(model: LlamaModel, variant: str, tokens: int) -> None:
    """Switch the model to an engine variant, with a pool of exactly `tokens` slots' worth."""
    paged, backend, graphs, compiled, multiple = VARIANTS[variant]
    model.kv_pool = None
    gc.collect()
    if model.config.device.type == "cuda":
        torch.cuda.empty_cache()
    model.config = replace(model.config, paged=paged, paged_backend=backend, cuda_graphs=graphs,
                           compiled=compiled, graph_row_multiple=multiple)
    if paged:
        s, bs = model.config.shape, BLOCK_SIZE
        model.kv_pool = KVPool(s.layers, s.kv_heads, s.head_dim, tokens // bs + 2,
                               model.config.dtype, model.config.device, growable=False)


def time_passes(model: LlamaModel, passes: list[PassSpec], context: int, repeats: int,
                generator: torch.Generator) -> dict[str, float]:
    """Median seconds of each pass, every request at `context` cached tokens."""
    device = model.config.device
    most = max(p.batch for p in passes)
    caches = [model.new_cache(context + 16) for _ in range(most)]
    for cache in caches:
        cache.fill_random_(context, generator)
    out = {}
    for p in passes:
        chosen = caches[: p.batch]
        tokens = [torch.randint(model.config.shape.vocab, (p.query,), device=device,
                                generator=generator) for _ in chosen]

        def reset(chosen=chosen):
            for cache in chosen:
                cache.length = context

        timing = time_call(lambda chosen=chosen, tokens=tokens: model(tokens, chosen),
                           device, warmup=3, repeats=repeats, setup=reset)
        out[p.name] = timing.median_s
    del caches
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--target", default="Llama-3.1-8B")
    parser.add_argument("--draft", default="Llama-3.2-1B")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="bf16 on CUDA, fp32 on CPU unless given")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="1,16,64,128")
    parser.add_argument("--verify", default="5x16", help="tokens x batch of the verify pass")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--copy-mib", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (CPU runs)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    verify_q, verify_b = (int(v) for v in args.verify.split("x"))
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if device.type != "cuda":
        skipped = [v for v in variants if VARIANTS[v][2]]
        variants = [v for v in variants if not VARIANTS[v][2]]
        if skipped:
            print(f"{device}: no CUDA graphs, skipping {', '.join(skipped)}")

    torch.manual_seed(0)
    generator = torch.Generator(device=device).manual_seed(0)
    bandwidth = copy_bandwidth(device, args.copy_mib)
    target = LlamaModel.random(config_for(get_model(args.target), dtype=dtype, device=device))
    draft = LlamaModel.random(config_for(get_model(args.draft), dtype=dtype, device=device))
    target_passes = [PassSpec(f"decode b{b}", "target", b, 1) for b in batches]
    target_passes.append(PassSpec(f"verify {verify_q} b{verify_b}", "target", verify_b, verify_q))
    draft_passes = [PassSpec("draft decode b1", "draft", 1, 1)]
    floors = {}
    for p in target_passes + draft_passes:
        model = target if p.role == "target" else draft
        read = weight_bytes(model) + p.batch * args.context * kv_bytes_per_token(model)
        floors[p.name] = read / bandwidth

    times: dict[str, dict[str, float]] = {}
    for variant in variants:
        times[variant] = {}
        for model, passes in ((target, target_passes), (draft, draft_passes)):
            most = max(p.batch for p in passes)
            configure(model, variant, most * (args.context + 32))
            times[variant] |= time_passes(model, passes, args.context, args.repeats, generator)
            configure(model, "per-request", 0)  # free the pool before the next model's
        print(f"{variant}: done", flush=True)

    names = [p.name for p in target_passes + draft_passes]
    best = {n: min(times[v][n] for v in variants) for n in names}
    engine = "compiled" if "compiled" in variants else variants[-1]
    targets = check_targets(times[engine], floors, batches, f"verify {verify_q} b{verify_b}",
                            verify_b)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    result = {
        "device": card, "torch": torch.__version__,
        "driver": _driver() if device.type == "cuda" else None,
        "target": args.target, "draft": args.draft, "dtype": str(dtype).removeprefix("torch."),
        "context": args.context, "repeats": args.repeats,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "floor_ms": {n: floors[n] * 1e3 for n in names},
        "median_ms": {v: {n: t * 1e3 for n, t in times[v].items()} for v in variants},
        "engine_variant": engine, "targets": targets,
    }
    print_table(result, names, variants, best)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_engine.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out / 'gpu_engine.json'}")
    return 0


def check_targets(engine: dict[str, float], floors: dict[str, float], batches: list[int],
                  verify: str, verify_b: int) -> list[dict]:
    """The issue's targets, for the engine's default variant."""
    rows = []

    def add(what: str, value: float, limit: float, unit: str) -> None:
        rows.append({"target": what, "value": value, "limit": limit, "unit": unit,
                     "met": value <= limit})

    if 1 in batches:
        add("decode b1 / floor", engine["decode b1"] / floors["decode b1"], 1.4, "x")
    if 128 in batches:
        add("decode b128 / floor", engine["decode b128"] / floors["decode b128"], 1.6, "x")
    if verify_b in batches:
        add(f"{verify} / decode b{verify_b}", engine[verify] / engine[f"decode b{verify_b}"],
            1.3, "x")
    add("draft decode b1", engine["draft decode b1"] * 1e3, 1.5, "ms")
    return rows


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _driver() -> str | None:
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def print_table(result: dict, names: list[str], variants: list[str], best: dict) -> None:
    print(f"\n{result['device']}, torch {result['torch']}, driver {result['driver']}; "
          f"{result['target']} (draft {result['draft']}) {result['dtype']}, context "
          f"{result['context']}; copy {result['copy_bandwidth_gb_s']:.0f} GB/s")
    head = "| pass | floor ms | " + " | ".join(variants) + " | best / floor |"
    print(head)
    print("|" + "---|" * (len(variants) + 3))
    for n in names:
        floor = result["floor_ms"][n]
        cells = " | ".join(f"{result['median_ms'][v][n]:.2f}" for v in variants)
        print(f"| {n} | {floor:.2f} | {cells} | {best[n] * 1e3 / floor:.2f}x |")
    print(f"\ntargets ({result['engine_variant']}):")
    for t in result["targets"]:
        print(f"  {t['target']}: {t['value']:.2f} {t['unit']} (<= {t['limit']}) "
              f"{'met' if t['met'] else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
