#!/usr/bin/env bash
# StarPO-S from the GPU-trained solver SFT start (sokoban_sft_gpu_solver100): runs given as
# ESTIMATOR:SEED[:LR] (estimator grpo or gigpo; lr default 2e-5), in order, each resumed where a
# cut-off session left it (README.md here):
#   nohup bash results/cpu/pilots/run_solverstart.sh grpo:0 gigpo:0 grpo:0:1e-5 > logs/solverstart.log 2>&1 &
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=$here/sokoban_sft_gpu_solver100/seed_0
for run in "$@"; do
    IFS=: read -r estimator seed lr <<< "$run"
    lr=${lr:-2e-5}
    name=sokoban_${estimator}_s_solverstart_${lr}_4x8_keep0.5_20
    w=$here/$name/seed_$seed
    suffix=",$estimator"
    [ "$estimator" = grpo ] && suffix=""  # the default estimator, as the first runs had it
    resume=()
    [ -f "$w/config.json" ] && resume=(--resume)
    echo "=== $estimator seed $seed lr $lr -> $w $(date +%T)"
    python experiments/run.py --config "$here/sokoban_shape.py:$lr,4,8,0.5,20$suffix" \
        --config.model.init_from="$start" --config.seed="$seed" --workdir "$w" "${resume[@]}" \
        || exit 1
done
