#!/usr/bin/env bash
# Every GPU figure of spectra in one call, on a machine with one CUDA GPU that can reach nothing.
#
#   python benchmarks/gpu/prepare.py        # here, once: .gpu/ (MiniLM in float16, the 8B shape, a 32k record)
#   bash benchmarks/gpu/run.sh [PART ...]   # there, from the repository root; results under $OUT (default gpu-out/)
#
# The device tool carries at most 64 MiB: for the spectra parts carry .gpu/minilm16 and .gpu/corpus.txt (45 MiB),
# and .whl/ holding transformers 5.24.0's wheel (13 MiB; `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl transformers==5.24.0`), not the whole .gpu/.
#
# PART: tests agreement decoder e2e routes presses attention eigen figure1 accuracy (default: all, in that order). Each part runs under
# its own time limit and the whole under BUDGET seconds (default 480; the parts took ~360 s on an H100): a part
# that would start with under 15 s left is skipped and said so, a part past its limit is stopped and said so, and
# the next part runs. Each part's output goes to $OUT/<part>.log and its last lines to the terminal; the summary at
# the end says what each part did. Wheels under .whl/ (a newer transformers) are installed into /tmp/site first
# when present.
#
#   tests      the tests marked `cuda` (pytest -m cuda): spectra routes, offload paths, analyze and the task protocol
#              on the GPU against the CPU                                                          (with agreement)
#   agreement  capture and spectra of MiniLM (real weights) on the GPU against the CPU: c@128 per layer
#   decoder    the task protocol on a Llama-3.1-8B-shaped decoder (bf16, random weights), one 32k record, the
#              4 presses x 4 ratios sweep and the full cache: peak GPU memory, seconds per example
#   e2e        the paper's Figure 1 workload: RoBERTa-base-shaped encoder at n = 512, sequences/s end to end with
#              --spectrum-device auto (and overlap as it chooses) and with the spectra inline on the GPU
#   routes     every route to the singular values of a batch of 512x512 P, on the GPU and on the CPU cores
#   presses    as decoder, every press at ratio 0.5
#   attention  the Linformer attention table (benchmarks/attention.py) at 512 ... 65536 tokens
#   eigen      the eigensolvers alone (benchmarks/gpu/figure1.py solvers): matrices/s at n = 128, 256, 512 for torch's
#              eigvalsh (a loop above 32 x 32) and cuSOLVER's batched XsyevBatched (float64, float32), the batched
#              route from P at the tolerances 1e-6, 1e-5, 1e-4 and the precisions it used
#   figure1    the Figure 1 workload end to end with the batched route (figure1.py workload): FIGURE1_ENCODER real
#              (default: MiniLM's weights from .gpu/, 6 x 12 heads, so FIGURE1_SAMPLES' default 20000 x 512 tokens
#              are Figure 1's 1.44 M matrices) or random (RoBERTa-base shape; rank-collapsed deep layers), float16
#              forward, the spectra within FIGURE1_TOLERANCE of c (default 1e-5), FIGURE1_BATCH sequences a batch
#              (default 128: the solver gets a layer's batch x heads matrices a call, and cuSOLVER ran 3,238 a second
#              at 384 a call, 3,899 at 2,048); the rate as it goes (every 10 s), and how many matrices each level solved
#   accuracy   c@k per layer and head and the mean curves of the batched route at each tolerance against the float64
#              CPU route on the same P (figure1.py accuracy; MiniLM's real weights from .gpu/ when prepared)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
BUDGET=${BUDGET:-480}
DEVICE=${DEVICE:-cuda}              # cpu: try the script where no GPU is (with SMALL=1: small sizes, a tiny decoder)
if [[ ${SMALL:-0} == 1 ]]; then
    MINILM=(--length 128 --samples 4); E2E=(--samples 8 --batch-size 2 --length 128)
    DECODER=(--model "${TINY_DECODER:?a tiny decoder folder}" --data "${TINY_TASKS:?its task file}" --dtype float32)
    ATTENTION=(--lengths 512,1024 --budgets 128 --tokens 2048); ROUTES=(--sizes 128)
    EIGEN=(--sizes 32,64 --matrices 16 --loop 4); FIGURE1=(--encoder "${FIGURE1_ENCODER:-random}" --samples 4 --length 64 --batch-size 2 --dtype float32)
    ACCURACY=(--samples 2 --length 64)
else
    MINILM=(--length 512 --samples 16); E2E=(--samples 32 --batch-size 8); DECODER=()
    ATTENTION=(--lengths 512,65536 --budgets 128 --tokens 65536); ROUTES=(--sizes 512)
    EIGEN=(); FIGURE1=(--encoder "${FIGURE1_ENCODER:-real}" --samples "${FIGURE1_SAMPLES:-20000}"
             --tolerance "${FIGURE1_TOLERANCE:-1e-5}" --batch-size "${FIGURE1_BATCH:-128}"); ACCURACY=()
fi
mkdir -p "$OUT"
START=$(date +%s)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >"$OUT/setup.log" 2>&1 || { echo "installing .whl failed: $(tail -3 "$OUT/setup.log")"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
    if ! python3 -c "import transformers" >>"$OUT/setup.log" 2>&1; then  # e.g. a package it checks is too old there
        echo "the carried wheels do not import (see $OUT/setup.log): using the machine's own packages"
        export PYTHONPATH=$PWD
    fi
else
    export PYTHONPATH=$PWD
fi
PY=python3
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    $PY -c "import os, torch, transformers, numpy, scipy, pandas
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(),
      '| transformers', transformers.__version__, '| numpy', numpy.__version__, 'scipy', scipy.__version__,
      'pandas', pandas.__version__)
print('cpus', os.cpu_count())"
} 2>&1 | tee "$OUT/environment.log"

declare -A LIMIT=([tests]=150 [agreement]=150 [decoder]=110 [e2e]=120 [routes]=45 [presses]=120 [attention]=80
                  [eigen]=120 [figure1]=180 [accuracy]=100)
#: the test modules holding tests marked `cuda` (collecting the whole suite would import what this machine lacks)
CUDA_TESTS=($(grep -l "mark.cuda" -r tests --include="test_*.py"))
rm -f "$OUT/summary.log"
say() { echo "$1" >>"$OUT/summary.log"; }

run_part() {  # name command...: run under min(its limit, what the budget leaves), log to $OUT/name.log
    local name=$1; shift
    local left=$((BUDGET - ($(date +%s) - START)))
    local limit=${LIMIT[$name]}
    if ((left < 15)); then
        say "$name: skipped (${left} s of the budget left)"; return
    fi
    ((limit > left)) && limit=$left
    local began=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local code=$?
    local took=$(($(date +%s) - began))
    case $code in
        0) say "$name: ok in ${took} s";;
        124|137) say "$name: STOPPED at its limit of ${limit} s";;
        *) say "$name: FAILED (exit $code) after ${took} s";;
    esac
    echo "=== $name (exit $code, ${took} s): $OUT/$name.log"
    tail -n 25 "$OUT/$name.log"
}

PARTS=("$@")
((${#PARTS[@]})) || PARTS=(tests agreement decoder e2e routes presses attention eigen figure1 accuracy)
echo "parts: ${PARTS[*]}"
want() { local p; for p in "${PARTS[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }

if want tests && want agreement; then  # correctness only: side by side (their timings are not figures)
    run_part agreement $PY benchmarks/gpu/agreement.py --device "$DEVICE" "${MINILM[@]}" &
    AGREEMENT=$!
    run_part tests $PY -m pytest -m cuda -q -rP -p no:cacheprovider "${CUDA_TESTS[@]}"
    wait $AGREEMENT
else
    want tests && run_part tests $PY -m pytest -m cuda -q -rP -p no:cacheprovider "${CUDA_TESTS[@]}"
    want agreement && run_part agreement $PY benchmarks/gpu/agreement.py --device "$DEVICE" "${MINILM[@]}"
fi
want decoder && run_part decoder $PY benchmarks/gpu/decoder.py --device "$DEVICE" --presses 4x4 "${DECODER[@]}"
want e2e && run_part e2e bash -c "$PY benchmarks/analyze_e2e.py --device $DEVICE ${E2E[*]} && \
    $PY benchmarks/analyze_e2e.py --device $DEVICE ${E2E[*]} --overlap off --spectrum-device same"
want routes && run_part routes $PY benchmarks/spectrum_devices.py "${ROUTES[@]}" --sequences 1 --repeats 1
want presses && run_part presses $PY benchmarks/gpu/decoder.py --device "$DEVICE" --presses all --ratios 0.5 \
    "${DECODER[@]}"
want attention && run_part attention $PY benchmarks/attention.py --device "$DEVICE" "${ATTENTION[@]}"
want eigen && run_part eigen $PY benchmarks/gpu/figure1.py solvers --device "$DEVICE" "${EIGEN[@]}"
want figure1 && run_part figure1 $PY benchmarks/gpu/figure1.py workload --device "$DEVICE" "${FIGURE1[@]}"
want accuracy && run_part accuracy $PY benchmarks/gpu/figure1.py accuracy --device "$DEVICE" "${ACCURACY[@]}"

echo
echo "=== summary ($(($(date +%s) - START)) s of a budget of ${BUDGET} s)"
cat "$OUT/summary.log"
# every log in one archive (the device tool brings back at most 8 files)
tar czf /tmp/gpu-logs.tgz -C "$OUT" . && rm -f "$OUT"/*.log && mv /tmp/gpu-logs.tgz "$OUT/logs.tgz"
