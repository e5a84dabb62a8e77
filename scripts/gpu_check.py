"""Correctness of the GPU engine's parts against references, before anything is timed.

1. kernel: the Triton paged-attention kernel (models/paged_triton.py) against the torch
   backend (gather + SDPA, in fp32) on random pools: GQA and MHA, decode and ragged verify,
   contexts across blocks and splits. On a CPU it runs through Triton's interpreter
   (TRITON_INTERPRET=1): tests/models/test_paged_triton.py does that in the vLLM environment,
   the only one here with triton.
2. model (CUDA): a random Llama-3.2-1B in fp32 fed the same prompts, then decode, verify and
   ragged passes, by every engine variant (per-request caches, paged eager, paged + CUDA
   graphs with each backend): logits against the per-request engine's; and an EAGLE head of
   its shape, graphs against eager.

Prints one line per case and exits 1 on the first mismatch.

    python scripts/gpu_check.py [--device cuda] [--kernel-only]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.paged_kv import KVPool, PagedBatch, attend_gathered

KERNEL_CASES = [  # (kv_heads, group, head_dim, per-request (cached, new), dtype)
    (2, 4, 64, [(0, 1)], torch.float32),
    (2, 4, 64, [(37, 1), (5, 1), (130, 1)], torch.float32),
    (1, 3, 32, [(16, 6), (3, 2), (70, 6), (0, 6)], torch.float32),
    (4, 1, 64, [(200, 5), (17, 5)], torch.float32),
    (2, 4, 64, [(90, 1), (33, 4)], torch.float16),
    (8, 2, 32, [(40 + 7 * r, 1) for r in range(40)], torch.float32),  # one split: no merge
]
CUDA_KERNEL_CASES = [  # the shapes the engine runs: Llama-3.1-8B's heads, long contexts, bf16
    (8, 4, 128, [(1024, 1)] * 16, torch.bfloat16),
    (8, 4, 128, [(2000, 5), (7, 5), (1500, 3), (64, 1)], torch.bfloat16),
]


def kernel_case(kv_heads: int, group: int, head_dim: int, requests: list[tuple[int, int]],
                dtype: torch.dtype, device: str, seed: int) -> float:
    from models.paged_triton import paged_attention

    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks = sum(-(-(c + 8) // 16) for c, _ in requests) + 8
    pool = KVPool(1, kv_heads, head_dim, blocks, dtype, device)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=gen).to(dtype))
    seqs = []
    for c, _ in requests:
        seq = pool.sequence(c)
        seq.length = c
        seqs.append(seq)
        pool.sequence(5)  # another sequence's blocks between theirs
    batch = PagedBatch([n for _, n in requests], seqs)
    tokens = sum(n for _, n in requests)
    q = torch.randn(tokens, kv_heads * group, head_dim, generator=gen).to(dtype).to(device)
    qmax = max(n for _, n in requests)
    want = attend_gathered(q.float(), pool.keys[0].float(), pool.values[0].float(),
                           batch.tensors, qmax, pool.block_size)
    got = paged_attention(q, pool.keys[0], pool.values[0], batch.tensors, qmax, pool.block_size)
    assert got.shape == want.shape and got.dtype == dtype
    assert torch.isfinite(got).all(), "non-finite output"
    return ((got.float() - want).norm() / want.norm()).item()


def check_store(device: str) -> float:
    """store_kv against two index_copy_: K and V of 37 tokens (strided views, as the layer
    passes them) into scattered slots; the largest difference (0 when right)."""
    from models.paged_triton import store_kv

    gen = torch.Generator().manual_seed(7)
    kv_heads, d = 4, 64
    qkv = torch.randn(37, 2 + 2 * kv_heads, d, generator=gen).to(device)
    keys, values = qkv[:, 2 : 2 + kv_heads], qkv[:, 2 + kv_heads :]
    slots = torch.randperm(200, generator=gen)[:37].to(device)
    caches = [torch.randn(200, kv_heads, d, generator=gen).to(device) for _ in range(2)]
    want = [c.clone().index_copy_(0, slots, new) for c, new in zip(caches, (keys, values))]
    store_kv(keys, values, caches[0], caches[1], slots)
    return max((a - b).abs().max().item() for a, b in zip(caches, want))


def check_kernel(device: str) -> bool:
    from models.paged_triton import available

    if not available():
        if device.startswith("cuda"):
            print("triton is not installed: the CUDA engine's kernel cannot run")
            return False
        print("kernel: triton is not installed here, skipped (tests/models/test_paged_triton.py "
              "runs it through the interpreter)")
        return True
    stored = check_store(device)
    print(f"store_kv: largest difference from index_copy_ {stored:.1e}", flush=True)
    if stored != 0:
        print("MISMATCH")
        return False
    cases = KERNEL_CASES + (CUDA_KERNEL_CASES if device.startswith("cuda") else [])
    for seed, (kv_heads, group, head_dim, requests, dtype) in enumerate(cases):
        error = kernel_case(kv_heads, group, head_dim, requests, dtype, device, seed)
        # fp32 on a GPU: tl.dot rounds its inputs to tf32 (~3e-4); bf16/fp16 inputs ~1e-3
        limit = {torch.float32: 1e-5 if device == "cpu" else 2e-3}.get(dtype, 1e-2)
        shown = requests if len(requests) < 6 else f"{len(requests)} x {requests[0]}"
        print(f"kernel kv_heads={kv_heads} group={group} d={head_dim} {shown} "
              f"{str(dtype).removeprefix('torch.')}: relative error {error:.2e} "
              f"(limit {limit:.0e})", flush=True)
        if not error < limit:
            print("MISMATCH")
            return False
    print("paged triton attention agrees with the torch backend")
    return True


def check_model(device: str) -> bool:
    from models.llama import LlamaModel, config_for
    from simulator.catalog import get_model

    model = LlamaModel.random(config_for(get_model("Llama-3.2-1B"), dtype=torch.float32,
                                         device=device))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(model.config.shape.vocab, (n,), generator=gen) for n in (100, 300, 37)]
    passes = [[1, 1, 1], [4, 4, 4], [1, 4, 2], [1, 1, 1]]
    feeds = [[torch.randint(model.config.shape.vocab, (n,), generator=gen) for n in q]
             for q in passes]
    variants = {  # (paged, backend, graphs, compiled)
        "per-request": (False, "torch", False, False), "paged-eager": (True, "torch", False, False),
        "paged-graphs": (True, "torch", True, False),
        "triton-graphs": (True, "triton", True, False),
        "compiled": (True, "triton", True, True)}
    outputs = {}
    for name, (paged, backend, graphs, compiled) in variants.items():
        model.config = replace(model.config, paged=paged, paged_backend=backend,
                               cuda_graphs=graphs, compiled=compiled)
        model.kv_pool = None
        model.reserve_pool(len(prompts), 512)
        caches = [model.new_cache(512) for _ in prompts]
        model([p.to(device) for p in prompts], caches, logits="last")
        outputs[name] = [model([t.to(device) for t in feed], caches) for feed in feeds]
        if graphs and not any(r.graphs for r in model.kv_pool.runners.values()):
            print(f"model {name}: no graph was captured")
            return False
    for name in list(variants)[1:]:
        for step, (got, want) in enumerate(zip(outputs[name], outputs["per-request"])):
            got, want = torch.cat(got).float(), torch.cat(want).float()
            error = ((got - want).norm() / want.norm()).item()
            same = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
            print(f"model {name} pass {step} {passes[step]}: relative error {error:.2e}, "
                  f"argmax agreement {same:.3f}", flush=True)
            if not error < 1e-2:
                print("MISMATCH")
                return False
    print("every engine variant gives the per-request engine's logits")
    return True


TUNE_LAUNCHES = [  # (keys per step, warps, stages)
    (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3), (32, 4, 2), (64, 8, 2), (256, 8, 3)]


def tune_kernel(device: str) -> None:
    """Time the kernel alone, per launch setting, on Llama-3.1-8B's heads at context 1024:
    decode at batch 1 and 128 and verify of 5 at batch 16, against the bytes of K/V it must
    read (CUDA events, median of 50 after 5)."""
    from models.paged_triton import paged_attention
    from profiler.timing import time_call

    kv_heads, group, d, context = 8, 4, 128, 1024
    for batch, q in ((1, 1), (128, 1), (16, 5)):
        pool = KVPool(1, kv_heads, d, batch * (context // 16 + 2) + 2, torch.bfloat16, device)
        pool.kv.normal_()
        seqs = []
        for _ in range(batch):
            seq = pool.sequence(context + q)
            seq.length = context
            seqs.append(seq)
        t = PagedBatch([q] * batch, seqs).tensors
        queries = torch.randn(batch * q, kv_heads * group, d, dtype=torch.bfloat16, device=device)
        moved = 2 * batch * (context + q) * kv_heads * d * 2  # K and V rows, bf16
        cells = []
        for step, warps, stages in TUNE_LAUNCHES:
            launch = {"keys_per_step": step, "num_warps": warps, "num_stages": stages}
            try:
                def call(launch=launch, queries=queries, pool=pool, t=t, q=q):
                    return paged_attention(queries, pool.keys[0], pool.values[0], t, q, 16,
                                           launch)

                timing = time_call(call, torch.device(device), warmup=5, repeats=50)
                cells.append(f"{step}/{warps}/{stages}: {timing.median_s * 1e6:.1f} us "
                             f"{moved / timing.median_s / 1e9:.0f} GB/s")
            except Exception as error:  # a setting the compiler refuses: say so, go on
                cells.append(f"{step}/{warps}/{stages}: failed ({type(error).__name__})")
        print(f"tune batch {batch} q {q} context {context}: " + "; ".join(cells), flush=True)


def check_head(device: str) -> bool:
    """An EAGLE head of Llama-3.2-1B's shape (random, fp32): a chain's passes and a ragged
    catch-up replayed as CUDA graphs against the same passes run eagerly."""
    from eagle.training import init_head
    from models.eagle_head import EagleHead
    from models.llama import LlamaModel, config_for
    from simulator.catalog import get_model

    target = LlamaModel.random(config_for(get_model("Llama-3.2-1B"), dtype=torch.float32,
                                          device=device))
    target.set_feature_layers((1, 8))
    vocab = target.config.shape.vocab
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(vocab, (n,), generator=gen) for n in (40, 9, 77)]
    feeds = [[1, 1, 1], [1, 1, 1], [2, 4, 1]]
    tokens = [[torch.randint(vocab, (n,), generator=gen) for n in q] for q in feeds]
    outputs = {}
    for graphs in (False, True):
        head = init_head(EagleHead(target, torch.arange(4096), (1, 8)), 0)
        head.config = replace(head.config, cuda_graphs=graphs)
        head.reserve_pool(3, 256)
        width = head.feature_width
        caches = [head.new_cache(256) for _ in prompts]
        g = torch.Generator().manual_seed(6)
        head([p.to(device) for p in prompts],
             [torch.randn(len(p), width, generator=g).to(device) for p in prompts], caches)
        outs = []
        for q, ts in zip(feeds, tokens):
            w = width if max(q) > 1 else target.config.shape.hidden
            feats = [torch.randn(n, w, generator=g).to(device) for n in q]
            outs.append(head([t.to(device) for t in ts], feats, caches))
        outputs[graphs] = outs
        if graphs and not any(r.graphs for r in head.kv_pool.runners.values()):
            print("head: no graph was captured")
            return False
    for step, ((h1, l1), (h0, l0)) in enumerate(zip(outputs[True], outputs[False])):
        error = max(((h1 - h0).norm() / h0.norm()).item(), ((l1 - l0).norm() / l0.norm()).item())
        print(f"head graphs pass {step} {feeds[step]}: relative error {error:.2e}", flush=True)
        if not error < 1e-2:
            print("MISMATCH")
            return False
    print("the EAGLE head's graphs give its eager passes")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--kernel-only", action="store_true")
    parser.add_argument("--tune", action="store_true",
                        help="CUDA: also time the kernel per launch setting")
    args = parser.parse_args(argv)
    if not check_kernel(args.device):
        return 1
    if args.kernel_only or not args.device.startswith("cuda"):
        return 0
    if args.tune:
        tune_kernel(args.device)
    return 0 if check_model(args.device) and check_head(args.device) else 1


if __name__ == "__main__":
    sys.exit(main())
