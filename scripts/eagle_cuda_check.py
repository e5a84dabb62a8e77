"""Check the EAGLE training pipeline on a GPU before a long run there, and time its stages.

    python scripts/eagle_cuda_check.py --device cuda [--out DIR]

A random SmolLM2-135M-shaped target (no weights to fetch) runs on `--device` and, with the same
weights, on the CPU. Each stage the training script uses on a GPU (batched generation, batched
features, the chain loss, training, the held-out chains, a saved head read back on the CPU) is
run on the device, compared with the CPU where both compute the same thing, and timed, so that
a real run's epochs can be sized from seconds per training sequence. Exits 1 if a comparison
fails (fp32: relative error over 1e-3; chains: under 95% of run lengths equal).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle.chains import eagle_runs
from eagle.losses import sequence_loss
from eagle.train_spec import TrainSpec
from eagle.training import draft_vocabulary, feature_rms, init_head, train_head
from eagle.training_data import Continuation, batched_features, continue_prompts, target_features
from models.eagle_head import EagleHead, load_head, save_head
from models.llama import LlamaModel, config_for
from simulator.catalog import get_model


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sequences", type=int, default=128,
                    help="training sequences (random tokens, 200-500 long)")
    ap.add_argument("--out", type=Path, help="write the trained check head here (head.npz)")
    ap.add_argument("--head-layers", type=int, default=1, help="decoder layers in the head")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device here")
    shape = get_model("SmolLM2-135M")
    cpu = LlamaModel.random(config_for(shape), seed=0)
    gpu = LlamaModel(config_for(shape, device=device))
    gpu.load_state_dict(cpu.state_dict())
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    rows, failed = [], []

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def stage(name: str, seconds: float, check: str = "", ok: bool = True) -> None:
        rows.append((name, f"{seconds:8.2f}", check, "ok" if ok else "FAIL"))
        if not ok:
            failed.append(name)
        print(f"{name}: {seconds:.2f} s {check} {'ok' if ok else 'FAIL'}", flush=True)

    rng = np.random.default_rng(0)
    prompts = [(f"p{i}", rng.integers(0, shape.vocab, int(rng.integers(20, 300))).tolist())
               for i in range(args.sequences)]
    with tempfile.TemporaryDirectory() as work:
        sync()
        t = time.perf_counter()
        made = continue_prompts(gpu, prompts[:8], [0.0], 16, Path(work), eos_id=None, batch=8)
        sync()
        stage("generation (greedy, 8 x 16 tokens)", time.perf_counter() - t,
              f"{sum(len(c.output) for c in made)} tokens")
        # sampled (--doc-temperature, the sampled Spec-Bench answers): the streams are CPU
        # generators, so the device's draws should be the CPU's but for rounding near-ties
        t = time.perf_counter()
        drawn = continue_prompts(gpu, prompts[:8], [1.0], 16, Path(work) / "t1", eos_id=None,
                                 seed=3, batch=8)
        sync()
        seconds = time.perf_counter() - t
        want = continue_prompts(cpu, prompts[:8], [1.0], 16, Path(work) / "t1-cpu",
                                eos_id=None, seed=3, batch=8)
        same = sum(a.output == b.output for a, b in zip(drawn, want))
        stage("generation (sampled at T=1, 8 x 16 tokens)", seconds,
              f"{same} of 8 the CPU's draws", same >= 6)
    conts = made + [Continuation(key, tuple(prompt), tuple(
        rng.integers(0, shape.vocab, int(rng.integers(100, 250))).tolist()))
        for key, prompt in prompts[8:]]
    t = time.perf_counter()
    data = batched_features(gpu, conts, batch=32)
    sync()
    errors = [relative_error(data[i][1], target_features(cpu, conts[i].tokens)) for i in range(3)]
    stage("features (batch 32)", time.perf_counter() - t,
          f"{sum(len(x) for x, _, _ in data)} positions; rel err vs CPU {max(errors):.1e}",
          max(errors) < 1e-3)

    hidden = shape.hidden
    vocab = draft_vocabulary([c.output for c in conts], 4096, always=[0], vocab=shape.vocab)
    rms = feature_rms(data, hidden)
    head = init_head(EagleHead(gpu, vocab, [], args.head_layers), 0, "random", rms)
    head_cpu = init_head(EagleHead(cpu, vocab, [], args.head_layers), 0, "random", rms)
    spec = TrainSpec(epochs=1)
    tokens, features, start = data[0]
    loss, _ = sequence_loss(head, tokens, features, spec, start)
    loss_cpu, _ = sequence_loss(head_cpu, tokens.cpu(), features.cpu(), spec, start)
    error = relative_error(loss.detach(), loss_cpu.detach())
    stage("chain loss, depths 1-3", 0.0, f"rel err vs CPU {error:.1e}", error < 1e-3)

    for packed in (False, True):
        head = init_head(EagleHead(gpu, vocab, [], args.head_layers), 0, "random", rms)
        sync()
        t = time.perf_counter()
        train_head(head, data, spec, log=lambda text: None, packed=packed)
        sync()
        seconds = time.perf_counter() - t
        stage(f"training, 1 epoch, {'packed' if packed else 'one sequence at a time'}", seconds,
              f"{seconds / len(data) * 1e3:.1f} ms per sequence")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.out or folder) / "head.npz"
        save_head(head, path, {"check": "random SmolLM2-135M-shaped target"})
        back_gpu, back_cpu = load_head(gpu, path), load_head(cpu, path)
        t = time.perf_counter()
        same, total = 0, 0
        for c in conts[:4]:
            run_gpu = eagle_runs(back_gpu, gpu, c.prompt, c.output, 4)[0]
            run_cpu = eagle_runs(back_cpu, cpu, c.prompt, c.output, 4)[0]
            same, total = same + int((run_gpu == run_cpu).sum()), total + len(run_gpu)
        stage("held-out chains (4 sequences, k=4)", time.perf_counter() - t,
              f"{same}/{total} run lengths equal to the CPU's", same >= 0.95 * total)
    print("\n| stage | seconds | check | |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
