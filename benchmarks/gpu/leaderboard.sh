#!/usr/bin/env bash
# The small-model leaderboard (docs/leaderboard.md) on one CUDA GPU that can reach nothing: every group of presses
# as its own `spectra evaluate` run, side by side on the one GPU, under one time budget.
#
#   bash benchmarks/gpu/leaderboard.sh WORK GGUF     # there, from the repository root; runs under WORK/runs/
#
# WORK holds the task files (leaderboard-1k.jsonl, leaderboard-questions-512.jsonl) and the fitted artifacts
# (artifacts/, the `spectra artifacts` commands of docs/leaderboard.md); GGUF is SmolLM2-135M-Instruct's Q4_1 file.
# Each run is stopped by SIGTERM (it ends its batch and leaves a resumable checkpoint) when BUDGET seconds (default
# 520) are spent; each run folder (or its .partial checkpoint) is packed to $OUT/<group>.tgz, the logs to
# $OUT/logs.tgz (the device tool brings back at most 8 files). DEVICE=cpu SAMPLES=1 tries it where no GPU is.
# RUNS names the runs to start (default: all six). All six side by side overfill an 80 GB H100 (the wrappers' run
# ran out of memory) and share it badly: benchmarks/RESULTS.md, section "GPU, second lease".
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=${1:?the work folder}
GGUF=${2:?the GGUF file}
OUT=${OUT:-$WORK/out}
BUDGET=${BUDGET:-520}
DEVICE=${DEVICE:-cuda}
THREADS=${THREADS:-3}
START=$(date +%s)
mkdir -p "$OUT" "$WORK/runs" "$WORK/logs"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$ROOT

command -v spectra >/dev/null || spectra() { python3 -m spectra "$@"; }  # not installed there: the checkout
RATIOS=0.25,0.5,0.75,0.875
SCORERS="streaming,knorm,snapkv,tova,random,observed,pyramidkv,keydiff,think,compactor,lagkv,expected_attention,kvzip"
SCORERS+=",cur,leverage,cap,simlayerkv"
WRAPPERS="adakv(expected_attention),adakv(snapkv),criticalkv(expected_attention),criticaladakv(expected_attention)"
WRAPPERS+=",criticalkv(snapkv),criticaladakv(snapkv),chunkkv(snapkv),block(keydiff),composed(snapkv,think)"
WRAPPERS+=",key_rerotation(knorm),kvcompose,kvgrad"
AXES="lowrank,linformer,loki,kivi2,kivi4,kivi8"
ARTIFACTS="kvzap(artifacts/kvzap-linear),kvzap(artifacts/kvzap-mlp),qfilter(artifacts/qfilter)"
ARTIFACTS+=",expected_attention_stats(artifacts/expected-attention-stats)"
MORE="merging(snapkv),entropy_gated_chunkkv(snapkv),chunk(keydiff)"
# the presses that compress only while decoding (decoding, cam, compression_ratio_decoding) are not ranked: every
# 512 steps at kvpress's default, they never compress within RULER's answers (docs/leaderboard.md)
#: group: task file, presses, GiB its decoding may hold, examples decoded together
declare -A DATA=([scorers]=leaderboard-1k.jsonl [wrappers]=leaderboard-1k.jsonl [axes]=leaderboard-1k.jsonl
                 [artifacts]=leaderboard-1k.jsonl [more]=leaderboard-1k.jsonl [questions]=leaderboard-questions-512.jsonl)
declare -A PRESSES=([scorers]=$SCORERS [wrappers]="$WRAPPERS,finch" [axes]=$AXES [artifacts]=$ARTIFACTS
                    [more]="$MORE,prefill_decoding(snapkv,tova)" [questions]="$SCORERS,$WRAPPERS,$AXES,$ARTIFACTS,$MORE")
declare -A MEMORY=([scorers]=16 [wrappers]=14 [axes]=6 [artifacts]=5 [more]=8 [questions]=8)
BATCH=${BATCH:-8}
SAMPLE=(); [[ -n ${SAMPLES:-} ]] && SAMPLE=(--samples "$SAMPLES")

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    python3 -c "import os, torch, transformers, gguf
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), '| transformers',
      transformers.__version__, '| cpus', os.cpu_count())"
    sha256sum "$GGUF"
} 2>&1 | tee "$WORK/logs/environment.log"

cd "$WORK"
declare -A PID
for group in ${RUNS:-scorers wrappers axes artifacts more questions}; do
    command=(spectra evaluate "$GGUF" --data "${DATA[$group]}" --presses "${PRESSES[$group]}" --ratios "$RATIOS"
             --device "$DEVICE" --batch-size "$BATCH" --decode-memory "${MEMORY[$group]}" --threads "$THREADS"
             --out "runs/leaderboard-$group" "${SAMPLE[@]}")
    resume=(); [[ -d runs/leaderboard-$group.partial ]] && resume=(--resume)
    echo "${command[*]}" >"logs/$group.command"
    "${command[@]}" "${resume[@]}" >"logs/$group.log" 2>&1 &
    PID[$group]=$!
done
if [[ $DEVICE == cuda ]]; then  # the GPU's memory while they run, every 5 s
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 5 >logs/nvidia-smi.log 2>&1 &
    SMI=$!
fi
while :; do
    running=0
    for group in "${!PID[@]}"; do kill -0 "${PID[$group]}" 2>/dev/null && running=1; done
    ((running)) || break
    if (($(date +%s) - START > BUDGET)); then
        echo "budget of $BUDGET s spent: stopping what runs (each ends its batch and leaves a checkpoint)"
        for group in "${!PID[@]}"; do kill -TERM "${PID[$group]}" 2>/dev/null; done
        for _ in $(seq 24); do
            sleep 2; running=0
            for group in "${!PID[@]}"; do kill -0 "${PID[$group]}" 2>/dev/null && running=1; done
            ((running)) || break
        done
        for group in "${!PID[@]}"; do kill -KILL "${PID[$group]}" 2>/dev/null; done  # the last checkpoint stays
        break
    fi
    sleep 5
done
[[ -n ${SMI:-} ]] && kill "$SMI" 2>/dev/null
declare -A CODE  # waited for here: the loop below runs in a pipeline's subshell, whose children they are not
for group in "${!PID[@]}"; do wait "${PID[$group]}"; CODE[$group]=$?; done
for group in "${!PID[@]}"; do
    echo "$group: exit ${CODE[$group]} after $(($(date +%s) - START)) s"
    tail -n 4 "logs/$group.log"
    folders=$(cd runs && ls -d "leaderboard-$group" "leaderboard-$group.partial" 2>/dev/null)
    if [[ -n $folders ]]; then tar czf "$OUT/$group.tgz" -C runs $folders; else echo "$group: nothing to pack"; fi
done 2>&1 | tee logs/summary.log
tar czf "$OUT/logs.tgz" logs
