#!/usr/bin/env bash
# All of the GPU engine's GPU work in one device call (docs/gpu-engine.md), inside DEADLINE
# seconds (default 540, 9 minutes), every result under $OUT:
#   1. scripts/gpu_check.py: the Triton kernel and every engine variant against references;
#   2. benchmarks/gpu_engine.py: decode/verify/draft pass times beside the memory floor
#      measured in the same run, per engine variant (-> gpu_engine.json);
#   3. spectune profile of Llama-3.1-8B with Llama-3.2-1B (the grid of the 2026-11-27 H200
#      run, for its held-out and ragged errors) (-> profile/);
#   4. spectune validate on the GPU with that profile, while time is left (-> validate/).
# A step that overruns its share is stopped (SIGINT, then killed) and the next one runs; the
# log and the finished files come back whatever happens. $OUT holds at most 8 files, so the
# folders travel as one results.tgz beside all.log, gpu_engine.json and the profile summary.
# Wheels the bare machine lacks (simpy) travel in .whl (carry it):
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl simpy==4.1.2
# TINY=1 runs the same steps on the CPU with tiny shapes in ~1-2 minutes
# (tests/test_device_gpu_script.py), so no GPU time is lost to a typo.
# Usage: OUT=folder [TINY=1] [DEADLINE=s] bash scripts/device_gpu.sh
set -u
: "${OUT:?set OUT to the folder that comes back}"
DEADLINE=${DEADLINE:-540}
PY=${PY:-python3}
SITE=${SITE:-/tmp/spectune-site}
WORK=${WORK:-$(mktemp -d)}
start=$SECONDS
mkdir -p "$OUT" "$WORK"
LOG="$OUT/all.log"
: > "$LOG"

if compgen -G ".whl/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl >> "$LOG" 2>&1 || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [[ -n ${TINY:-} ]]; then
    DEV=cpu TARGET=SmolLM2-135M DRAFT=Llama-68M
    export TRITON_INTERPRET=1  # where triton is installed, its kernel runs on the CPU
    ENGINE_ARGS="--context 64 --batch-sizes 1,4 --verify 3x4 --repeats 3 --copy-mib 64"
    PROFILE_ARGS="--batch-sizes 1,2 --query-tokens 1,3 --context-tokens 16,64 --prompt-tokens 16,32
                  --prefill-batch-sizes 1 --repeats 1 --ragged 3"
    VALIDATE_ARGS="--model $TARGET --drafter model:$DRAFT --acceptance beta:7,3~20 --requests 6
                   --output-tokens 12 --rates 4 --policies fixed:k=0,fixed:k=2 --max-num-seqs 4
                   --no-drift --no-overhead"
else
    DEV=cuda TARGET=Llama-3.1-8B DRAFT=Llama-3.2-1B
    ENGINE_ARGS="--context 1024 --batch-sizes 1,16,64,128 --verify 5x16 --repeats 20"
    PROFILE_ARGS="--batch-sizes 1,4,16,64,128 --query-tokens 1,3,5 --context-tokens 256,1024,2048
                  --prompt-tokens 128,512,2048 --prefill-batch-sizes 1,4 --repeats 3 --ragged 20"
    VALIDATE_ARGS="--model $TARGET --drafter model:$DRAFT --acceptance beta:7,3~20
                   --workload azure-conv --requests 32 --max-num-seqs 16 --rates 1 4
                   --policies fixed:k=0,fixed:k=4"
fi

pack() {  # the folders as one file (the device returns at most 8)
    cp "$WORK/engine/gpu_engine.json" "$OUT/" 2>/dev/null
    cp "$WORK/profile/summary.json" "$OUT/profile_summary.json" 2>/dev/null
    tar -czf "$OUT/results.tgz" -C "$WORK" . 2>/dev/null
}
trap 'pack; exit 130' INT TERM

step() {  # step NAME SECONDS COMMAND...: run with at most SECONDS (and what is left)
    local name=$1 budget=$2 left=$((DEADLINE - (SECONDS - start))) began=$SECONDS
    shift 2
    if (( left < 15 )); then echo "== $name: skipped, $left s left" | tee -a "$LOG"; return; fi
    (( budget > left )) && budget=$left
    echo "== $name (at most $budget s): $*" | tee -a "$LOG"
    timeout --signal=INT --kill-after=20 "$budget" "$@" 2>&1 | tee -a "$LOG"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - began)) s" | tee -a "$LOG"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1 || true
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  $PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1; } | tee -a "$LOG"

step check 120 $PY scripts/gpu_check.py --device $DEV --tune
# shellcheck disable=SC2086
step engine 200 $PY benchmarks/gpu_engine.py --device $DEV --target $TARGET --draft $DRAFT \
    $ENGINE_ARGS --out "$WORK/engine"
pack
# shellcheck disable=SC2086
step profile 200 $PY -m spectune profile --device $DEV --target $TARGET --draft $DRAFT \
    $PROFILE_ARGS --out "$WORK/profile"
pack
# shellcheck disable=SC2086
# recompiles logged: in the second H200 run a prompt length's first prefill cost ~100 ms more
TORCH_LOGS=${TORCH_LOGS-recompiles} step validate 400 $PY -m spectune validate --device $DEV \
    $VALIDATE_ARGS --profile "$WORK/profile" --out "$WORK/validate"
pack
echo "== done after $((SECONDS - start)) s" | tee -a "$LOG"
