#!/usr/bin/env bash
# One GPU check within 8 minutes: the timing methods side by side on the traced GEMM shapes
# (benchmarks/timing_methods.py, at most 1 minute), then the whole tracecal loop on the GPU with a
# model sized to its memory (benchmarks/gpu_demo.py, at most 7 minutes; extra arguments go to it, e.g.
# --pp 2 on two GPUs). Writes timing_methods.{json,md}, components.csv, components.md, summary.txt,
# the demo's database and logs to $OUT when set (else to a new temporary directory). Exits non-zero,
# saying why, without a CUDA device.
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
# the 8-minute budget is enforced here: 60 s for the timing comparison, 420 s for the demo
if ! timeout 60 "$PYTHON" benchmarks/timing_methods.py --measure --out "$OUT" >"$OUT/timing_methods.log" 2>&1; then
    echo "timing_methods.py failed (see $OUT/timing_methods.log); the demo runs anyway" >&2
fi
timeout 420 "$PYTHON" benchmarks/gpu_demo.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_demo.log"
exit "${PIPESTATUS[0]}"
