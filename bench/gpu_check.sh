#!/usr/bin/env bash
# GPU check: verdicts and throughput on one GPU, with models of seeded random weights.
#
#   bash bench/gpu_check.sh [--dry-run] [--plan] [bench/gpu_check.py options]
#
# Runs on a bare, offline GPU machine from this tree plus the wheel folder `make gpu-wheels` builds
# (bench/wheels/pyX.Y for that machine's python3), in one call: `OUT=DIR bash bench/gpu_check.sh`
# under an outer limit of 540 s (the default --budget of 480 s, counted from this script's start, plus
# margin). It installs those wheels with --no-index into a scratch folder, puts it and this tree on
# PYTHONPATH (kvgraft is not installed) and runs bench/gpu_check.py: it measures the storage and rates
# first, prints its plan (--plan: only that), then runs each step whose estimate fits what is left of
# the budget and cuts one that overruns it at the budget. Models are built from configs on the device;
# nothing is downloaded. It writes gpu_check.md (ready for bench/RESULTS.md), gpu_check.json and this
# log to $OUT (default out/gpu-check) after every step; releases and models go to $WORK (default
# /tmp/kvgraft-gpu-check), never to $OUT. --dry-run: tiny models on the CPU.
# Environment: PY (default python3), GPU_WHEELS (default bench/wheels/py<PY's version>), OUT, WORK.
set -euo pipefail
STARTED_AT=$(date +%s.%N)
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
OUT="${OUT:-out/gpu-check}"
WORK="${WORK:-/tmp/kvgraft-gpu-check}"
WHEELS="${GPU_WHEELS:-bench/wheels/py$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "$WHEELS: no wheels; run 'make gpu-wheels' (GPU_PY=<the GPU machine's python version>) and carry the folder" >&2
  exit 2
fi
mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK"
t0=$SECONDS
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --target "$WORK/site" "$WHEELS"/*.whl
echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $WORK/site in $((SECONDS - t0)) s" | tee "$OUT/gpu_check.log"
export PYTHONPATH="$WORK/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  KVGRAFT_HOME="$WORK/home" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
"$PY" bench/gpu_check.py --out "$OUT" --work "$WORK" --started-at "$STARTED_AT" "$@" 2>&1 | tee -a "$OUT/gpu_check.log"
