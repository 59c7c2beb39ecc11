#!/usr/bin/env bash
# One GPU check: the whole tracecal loop on one CUDA GPU (benchmarks/gpu_demo.py) within 8 minutes.
# Writes components.csv, components.md, summary.txt, the demo's database and logs to $OUT when set
# (else to a new temporary directory). Exits non-zero, saying why, without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d -t tracecal-gpu-check-XXXXXX)}"
export OUT
mkdir -p "$OUT"
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c "import tracecal, torch" 2>"$OUT/import.log"; then
    echo "tracecal or torch is not importable by $PYTHON: install with 'pip install -e .' and a CUDA build of torch" >&2
    exit 2
fi
{ nvidia-smi || echo "nvidia-smi not found"; } >"$OUT/nvidia-smi.txt" 2>&1
# the demo's stage timings go to the log; the 8-minute budget is enforced here
timeout 480 "$PYTHON" benchmarks/gpu_demo.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_demo.log"
exit "${PIPESTATUS[0]}"
