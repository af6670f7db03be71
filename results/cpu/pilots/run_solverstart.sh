#!/usr/bin/env bash
# StarPO-S GRPO from the GPU-trained solver SFT start (sokoban_sft_gpu_solver100), seeds in
# order, each resumed where a cut-off session left it (README.md here):
#   nohup bash results/cpu/pilots/run_solverstart.sh 0 1 2 > logs/solverstart.log 2>&1 &
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=$here/sokoban_sft_gpu_solver100/seed_0
for seed in "$@"; do
    w=$here/sokoban_grpo_s_solverstart_2e-5_4x8_keep0.5_20/seed_$seed
    resume=()
    [ -f "$w/config.json" ] && resume=(--resume)
    echo "=== seed $seed -> $w $(date +%T)"
    python experiments/run.py --config "$here/sokoban_shape.py:2e-5,4,8,0.5,20" \
        --config.model.init_from="$start" --config.seed="$seed" --workdir "$w" "${resume[@]}" \
        || exit 1
done
