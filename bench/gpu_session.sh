#!/bin/bash
# One call on a lent GPU machine with a few minutes of it: bench/gpu.py (issue 43's figures) first, then
# bench/gpu_check.py (every command through the CLI) in the time left, both tables appended to OUT/RESULTS.md,
# their logs beside it. All within SECONDS_ALL (default 570): the proof has SHARE percent of it (default 100: the
# proof alone; the check runs where 60 s or more are left; SHARE=0: the check alone, for a second call), each a
# --budget and a timeout 25 s past it (a script stopped by its timeout still appends the rows of what had ended;
# each part's figures are in gpu.log as it ends).
#
#   bash bench/gpu_session.sh [SECONDS_ALL [OUT]]       # OUT: default bench/ (bench/RESULTS.md)
#   make gpu-session-system                             # the same, with the machine's own python3
#
# Wheels the machine lacks (tomli-w; nvImageCodec's, nvidia-nvimgcodec-cu13 and nvidia-nvjpeg, for its parts):
# WHEELS=DIR installs DIR/*.whl into a folder of its own first. PARTS: the proof's parts, in the order they run
# (bench/gpu.py --parts; the compile parts together, where the first of them is). By default, what the 2026-12-04
# calls left to learn, in two calls, as a session's 15 minutes of device time hold them (a start takes 1-2):
# - CALL=1 (the default), what runs eagerly, furthest target first: StyleGAN2's rate (48 img/s of 250) now that
#   its filter's double backward is one convolution and its batch one micro-batch, its profile, its FIR filter
#   six ways (bench/fir.py) and its step with the fused kernels (bigbatch/models/fused.py); SAEHD's (0.173 s of
#   0.15) in NCHW, channels-last and autotuned, and its profile; ResNet-50's profile (4,325 img/s of 6,000); nvJPEG's crops resized as a batch
#   (ef29df3) and ResNet-50 fed by them; BigGAN's eager profile (GPU busy); the iterations' waits; the CUDA tests
#   that compile nothing.
# - CALL=2, compiling: ResNet-50 in torch.compile's default mode (its lever to 6,000 img/s), its first step again in
#   a new process from the compile cache that leaves (the warm start, 20 s), the CUDA tests that compile (CUDA
#   graphs' bit-exact resume among them); then, in what is left, StyleGAN2 under train.compile with the fused
#   kernels (its lazy penalty steps eager, their filter and activation compiled).
# The first call at once, the second while the machine is warm, in what device time is left (status()'s
# budget_left_s less about 40 s for the transfers):
#     run(command="WHEELS=gpu_wheels make gpu-session-system GPU_SECONDS=480 OUT=$OUT", carry=["gpu_wheels"],
#         timeout_s=500)
#     run(command="WHEELS=gpu_wheels CALL=2 make gpu-session-system GPU_SECONDS=<budget_left_s - 60> OUT=$OUT",
#         carry=["gpu_wheels"], timeout_s=<budget_left_s - 40>)
# The check runs in what a call leaves (SHARE=0: the check alone). STEPS: which of the check's steps (default: all).
# DRY=1: both at toy sizes on this CPU (a test of this script).
set -u
ALL=${1:-570}
OUT=${2:-${OUT:-bench}}
PYTHON=${PYTHON:-python3}
SHARE=${SHARE:-100}
REPO=$(cd "$(dirname "$0")/.." && pwd)
FIRST=stylegan2-bf16,stylegan2-bf16-profile,fir,stylegan2-bf16-fused,saehd512,saehd512-channels-last
FIRST=$FIRST,saehd512-autotuned,saehd512-profile,resnet50-profile,jpeg-decode,resnet50-fed,biggan-bf16-profile
FIRST=$FIRST,waits,cuda-tests
SECOND=resnet50-compile,resnet50-compile-again,cuda-tests-compile,stylegan2-bf16-compile-fused
case ${CALL:-1} in
    1) PARTS=${PARTS:-$FIRST} ;;
    2) PARTS=${PARTS:-$SECOND} ;;
    *) echo "gpu_session: CALL is 1 or 2, not ${CALL}" >&2; exit 2 ;;
esac
STEPS=${STEPS:-}
FLAGS=()
if [ "${DRY:-0}" = 1 ]; then FLAGS=(--device cpu --dry-run); fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
    SITE=$(mktemp -d /tmp/bigbatch-wheels-XXXXXX)
    if ! $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl; then
        echo "gpu_session: the wheels in WHEELS=$WHEELS did not install (carried there?)" >&2
        exit 2
    fi
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
{
    nvidia-smi
    $PYTHON -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version())"
    echo "cores: $(nproc)"
} >"$OUT/machine.txt" 2>&1
# Before any budget is spent: bigbatch imports (tomli-w is not on a GPU image: WHEELS) and sees the GPU.
READY="import bigbatch, torch; assert torch.cuda.is_available() or '${DRY:-0}' == '1', 'torch sees no CUDA GPU'"
if ! WHY=$($PYTHON -c "$READY" 2>&1); then
    echo "gpu_session: not ready: $(echo "$WHY" | tail -1)" | tee -a "$OUT/machine.txt" >&2
    exit 2
fi

# Each script in the background, waited for, so that a stop of this one reaches it (it then writes its table).
CHILD=
STOPPED=
trap 'STOPPED=1; [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null' TERM INT
PROOF_STATUS=0
PROOF=$(((ALL - SECONDS) * SHARE / 100 - 35))  # (the preflight's seconds; its timeout's 25 s and -k 10 after)
if [ "$PROOF" -gt 0 ]; then
    timeout -k 10 $((PROOF + 25)) $PYTHON "$REPO/bench/gpu.py" "${FLAGS[@]}" --budget $PROOF --parts "$PARTS" \
        --out "$OUT/RESULTS.md" >"$OUT/gpu.log" 2>&1 &
    CHILD=$!
    wait $CHILD
    PROOF_STATUS=$?
    wait $CHILD 2>/dev/null  # (a trapped signal ends the first wait early)
    echo "bench/gpu.py: exit status $PROOF_STATUS at ${SECONDS} s" >>"$OUT/gpu.log"
fi

CHECK=$((ALL - SECONDS - 25))
if [ $CHECK -lt 60 ] || [ -n "$STOPPED" ]; then
    echo "bench/gpu_check.py: not run (${CHECK} s left${STOPPED:+; stopped})" >"$OUT/check.log"
    exit $PROOF_STATUS
fi
KEEP=$(mktemp -d /tmp/bigbatch-gpu-check-XXXXXX)
# shellcheck disable=SC2086 # (STEPS: options, split as words)
timeout -k 10 $((CHECK + 20)) $PYTHON "$REPO/bench/gpu_check.py" "${FLAGS[@]}" --budget $CHECK $STEPS --keep "$KEEP" \
    --out "$OUT/RESULTS.md" >"$OUT/check.log" 2>&1 &
CHILD=$!
wait $CHILD
CHECK_STATUS=$?
wait $CHILD 2>/dev/null
echo "bench/gpu_check.py: exit status $CHECK_STATUS at ${SECONDS} s" >>"$OUT/check.log"
tar czf "$OUT/check-logs.tgz" -C "$KEEP" logs 2>/dev/null
exit $((PROOF_STATUS || CHECK_STATUS))
