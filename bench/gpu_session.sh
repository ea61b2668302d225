#!/bin/bash
# One call on a lent GPU machine with a few minutes of it: bench/gpu.py (issue 43's figures) first, then
# bench/gpu_check.py (every command through the CLI) in the time left, both tables appended to OUT/RESULTS.md,
# their logs beside it. All within SECONDS_ALL (default 570): each script has its --budget and a timeout 25 s
# past it (a script stopped by its timeout still appends the rows of what had ended).
#
#   bash bench/gpu_session.sh [SECONDS_ALL [OUT]]       # OUT: default bench/ (bench/RESULTS.md)
#   make gpu-session-system                             # the same, with the machine's own python3
#
# Wheels the machine lacks (tomli-w; nvImageCodec's, nvidia-nvimgcodec-cu13 and nvidia-nvjpeg, for its parts):
# WHEELS=DIR installs DIR/*.whl into a folder of its own first. PARTS: the proof's parts, in the order they run
# (bench/gpu.py --parts; the compile parts together, where the first of them is). STEPS: which of the check's
# steps (default "--skip cuda-tests": the proof runs them). DRY=1: both at toy sizes on this CPU (a test of this
# script).
set -u
ALL=${1:-570}
OUT=${2:-${OUT:-bench}}
PYTHON=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PARTS=${PARTS:-biggan-bf16,resnet50,saehd512,stylegan2-bf16,biggan-bf16-compile,biggan-bf16-compile-cudagraphs,stylegan2-bf16-compile,resnet50-compile-cudagraphs,jpeg-decode,jpeg-decode-nvimgcodec,resnet50-fed,cuda-tests,waits,cuda-tests-compile}
STEPS=${STEPS:---skip cuda-tests}
FLAGS=()
if [ "${DRY:-0}" = 1 ]; then FLAGS=(--device cpu --dry-run); fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
    SITE=$(mktemp -d /tmp/bigbatch-wheels-XXXXXX)
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
{
    nvidia-smi
    $PYTHON -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version())"
    echo "cores: $(nproc)"
} >"$OUT/machine.txt" 2>&1

PROOF=$((ALL * 62 / 100))
timeout $((PROOF + 25)) $PYTHON "$REPO/bench/gpu.py" "${FLAGS[@]}" --budget $PROOF --parts "$PARTS" \
    --out "$OUT/RESULTS.md" >"$OUT/gpu.log" 2>&1
PROOF_STATUS=$?
echo "bench/gpu.py: exit status $PROOF_STATUS at ${SECONDS} s" >>"$OUT/gpu.log"

CHECK=$((ALL - SECONDS - 25))
if [ $CHECK -lt 60 ]; then
    echo "bench/gpu_check.py: not run, ${CHECK} s left" >"$OUT/check.log"
    exit 1
fi
KEEP=$(mktemp -d /tmp/bigbatch-gpu-check-XXXXXX)
# shellcheck disable=SC2086 # (STEPS: options, split as words)
timeout $((CHECK + 20)) $PYTHON "$REPO/bench/gpu_check.py" "${FLAGS[@]}" --budget $CHECK $STEPS --keep "$KEEP" \
    --out "$OUT/RESULTS.md" >"$OUT/check.log" 2>&1
CHECK_STATUS=$?
echo "bench/gpu_check.py: exit status $CHECK_STATUS at ${SECONDS} s" >>"$OUT/check.log"
tar czf "$OUT/check-logs.tgz" -C "$KEEP" logs 2>/dev/null
exit $((PROOF_STATUS || CHECK_STATUS))
