#!/usr/bin/env bash
# The GPU check: every `gpu` test of the repository and the short GPU benches in one call of at
# most 9.5 minutes, ending in one table (group, passed/failed/skipped, key figure) headed by the GPU
# and the date, printed and written to $OUT/gpu_check.md (without $OUT: runs/gpu_check/gpu_check.md).
# It runs from a plain copy of the repository on a machine without network, Ray or vLLM, through
# scripts/gpu_run.sh: nothing is installed; the sources go on PYTHONPATH, with a folder that holds
# the carried wheels the machine lacks and the metadata plugin discovery reads.
#
#   python3 scripts/gpu_check/offline_env.py download .whl   # beforehand, where a package index is reachable
#   bash scripts/gpu_check.sh                                # on the GPU machine, with .whl/ carried along
#   bash scripts/gpu_check.sh --only "gpu tests" --budget 300   # a subset (see scripts/gpu_check/driver.py)
#
# PYTHON (default python3) is the interpreter; RLWEAVE_WHEELS (default .whl) the wheel folder.
# Exit code 1 when a group failed or timed out. docs/gpu.md says what each group covers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
exec bash scripts/gpu_run.sh timeout --kill-after=10 "${GPU_CHECK_TIMEOUT_S:-570}" "$PY" scripts/gpu_check/driver.py \
    --python "$PY" "$@"
