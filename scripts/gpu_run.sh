#!/usr/bin/env bash
# Run a command with rlweave importable on a GPU machine without network, Ray or vLLM: nothing is
# installed; the sources go on PYTHONPATH behind a temporary folder that holds the carried wheels
# the machine lacks and the metadata plugin discovery reads (scripts/gpu_check/offline_env.py).
# scripts/gpu_check.sh runs its checks through it; other GPU measurements can too, e.g.
#
#   bash scripts/gpu_run.sh python3 bench/async_rollout.py --role-threads 0 \
#       --override run.scheduler=in_process --override roles.rollout.engine=hf --override 'roles.rollout.options={}'
#
# PYTHON (default python3) is the interpreter; RLWEAVE_WHEELS (default .whl) the wheel folder
# (`python3 scripts/gpu_check/offline_env.py download .whl` where a package index is reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${RLWEAVE_WHEELS:-.whl}
SITE=$(mktemp -d "${TMPDIR:-/tmp}/rlweave_gpu_site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT

echo "[gpu_run] Python environment ($PY; wheels from $WHEELS):" >&2
"$PY" scripts/gpu_check/offline_env.py site "$SITE" --wheels "$WHEELS" >&2
SRC=$(ls -d "$PWD/core/src" "$PWD"/plugins/*/src | paste -sd:)
export PYTHONPATH="$SITE:$SRC${PYTHONPATH:+:$PYTHONPATH}"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
"$@"
