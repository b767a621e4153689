#!/usr/bin/env bash
# The small-model leaderboard (docs/leaderboard.md) on one CUDA GPU machine that can reach nothing: every group of
# presses as its own `spectra evaluate` run, side by side, under one time budget.
#
#   bash benchmarks/gpu/leaderboard.sh WORK GGUF     # there, from the repository root; runs under WORK/runs/
#
# WORK holds the task files (leaderboard-1k.jsonl, leaderboard-questions-512.jsonl) and the fitted artifacts
# (artifacts/, the `spectra artifacts` commands of docs/leaderboard.md); GGUF is SmolLM2-135M-Instruct's Q4_1 file.
# Each run is stopped by SIGTERM (it ends its batch and leaves a resumable checkpoint) when BUDGET seconds (default
# 520) are spent; each run folder (or its .partial checkpoint) is packed to $OUT/<group>.tgz, the logs to
# $OUT/logs.tgz (the device tool brings back at most 8 files). A run left in WORK/runs as .partial is resumed.
# RUNS names the runs to start (default: the fourth lease's: the many-question run on the GPU and the decoding and
# merging presses, one run per press, on the machine's CPU cores beside it). The groups that compress once per
# example and decode with few steps' work (scorers, wrappers, axes, artifacts) suit the GPU; a group whose presses
# work at every decoding step leaves it idle (16% busy) and runs faster on CPU cores, one run per press. All six
# GPU runs side by side overfill an 80 GB H100 and share it badly: benchmarks/RESULTS.md, "GPU, second lease" to
# "GPU, fourth lease". DEVICE=cpu SAMPLES=1 tries it where no GPU is.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=${1:?the work folder}
GGUF=${2:?the GGUF file}
OUT=${OUT:-$WORK/out}
BUDGET=${BUDGET:-520}
GPU=${DEVICE:-cuda}
THREADS=${THREADS:-3}
START=$(date +%s)
mkdir -p "$OUT" "$WORK/runs" "$WORK/logs"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$ROOT

# not installed there: the checkout. An array, not a shell function: a function would run in a subshell whose PID
# gets the SIGTERM while Python goes on
SPECTRA=(spectra); command -v spectra >/dev/null || SPECTRA=(python3 -m spectra)
RATIOS=0.25,0.5,0.75,0.875
SCORERS="streaming,knorm,snapkv,tova,random,observed,pyramidkv,keydiff,think,compactor,lagkv,expected_attention,kvzip"
SCORERS+=",cur,leverage,cap,simlayerkv"
WRAPPERS="adakv(expected_attention),adakv(snapkv),criticalkv(expected_attention),criticaladakv(expected_attention)"
WRAPPERS+=",criticalkv(snapkv),criticaladakv(snapkv),chunkkv(snapkv),block(keydiff),composed(snapkv,think)"
WRAPPERS+=",key_rerotation(knorm),kvcompose,kvgrad"
AXES="lowrank,linformer,loki,kivi2,kivi4,kivi8"
ARTIFACTS="kvzap(artifacts/kvzap-linear),kvzap(artifacts/kvzap-mlp),qfilter(artifacts/qfilter)"
ARTIFACTS+=",expected_attention_stats(artifacts/expected-attention-stats)"
# the presses that compress only while decoding (decoding, cam, compression_ratio_decoding) are not ranked: every
# 512 steps at kvpress's default, they never compress within RULER's answers (docs/leaderboard.md)
#: group: task file, presses, GiB its decoding may hold, examples decoded together
#: the decoding and merging presses, one run each
declare -A MORE=([more-merging]="merging(snapkv)" [more-egchunkkv]="entropy_gated_chunkkv(snapkv)"
                 [more-chunk]="chunk(keydiff)" [more-prefill]="prefill_decoding(snapkv,tova)")
QUESTIONS="$SCORERS,$WRAPPERS,$AXES,$ARTIFACTS,merging(snapkv),entropy_gated_chunkkv(snapkv),chunk(keydiff)"
#: group: task file, presses, device, GiB its decoding may hold, examples decoded together
declare -A DATA=([scorers]=leaderboard-1k.jsonl [wrappers]=leaderboard-1k.jsonl [axes]=leaderboard-1k.jsonl
                 [artifacts]=leaderboard-1k.jsonl [questions]=leaderboard-questions-512.jsonl)
declare -A PRESSES=([scorers]=$SCORERS [wrappers]="$WRAPPERS,finch" [axes]=$AXES [artifacts]=$ARTIFACTS
                    [questions]=$QUESTIONS)
declare -A ON=([scorers]=$GPU [wrappers]=$GPU [axes]=$GPU [artifacts]=$GPU [questions]=$GPU)
declare -A MEMORY=([scorers]=16 [wrappers]=14 [axes]=6 [artifacts]=5 [questions]=40)
declare -A BATCHES=([scorers]=${BATCH:-8} [wrappers]=${BATCH:-8} [axes]=${BATCH:-8} [artifacts]=${BATCH:-8}
                    [questions]=${BATCH:-8})
for group in "${!MORE[@]}"; do
    DATA[$group]=leaderboard-1k.jsonl; PRESSES[$group]=${MORE[$group]}; ON[$group]=cpu; MEMORY[$group]=8
    BATCHES[$group]=1
done
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
for group in ${RUNS:-questions more-merging more-egchunkkv more-chunk more-prefill}; do
    command=(evaluate "$GGUF" --data "${DATA[$group]}" --presses "${PRESSES[$group]}" --ratios "$RATIOS"
             --device "${ON[$group]}" --batch-size "${BATCHES[$group]}" --decode-memory "${MEMORY[$group]}"
             --threads "$THREADS" --out "runs/leaderboard-$group" "${SAMPLE[@]}")
    resume=(); [[ -d runs/leaderboard-$group.partial ]] && resume=(--resume)
    echo "spectra ${command[*]}" >"logs/$group.command"
    "${SPECTRA[@]}" "${command[@]}" "${resume[@]}" >"logs/$group.log" 2>&1 &
    PID[$group]=$!
done
if [[ $GPU == cuda ]]; then  # the GPU's memory while they run, every 5 s
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
