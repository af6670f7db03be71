#!/usr/bin/env bash
# StarPO-S from the GPU-trained solver SFT start (sokoban_sft_gpu_solver100): runs given as
# METHOD:SEED[:LR[:MODE[:RANK[:SHAPE]]]] (METHOD: sokoban_shape.py's, grpo, gigpo, ppo (StarPO-S
# PPO with its critic) or vanilla (vanilla StarPO's GRPO, no filter); lr default 2e-5; MODE the group
# normalisation, advantage.grpo_mode and, for gigpo, step_mode: mean_std (default) or mean,
# Dr.GRPO's / the original's norm_adv_by_std_in_grpo=False; RANK: a LoRA policy of that rank
# on the merged start, default 0: full fine-tuning; SHAPE: groups x group size, default 4x8),
# in order, each resumed where a cut-off session left it (README.md here):
#   nohup bash results/cpu/pilots/run_solverstart.sh grpo:0 gigpo:0 grpo:0:1e-5 > logs/solverstart.log 2>&1 &
# STEPS (default 20): the runs' length, in their names too. START: the SFT workdir (default the
# solver start; START_LABEL names it in the runs' directories, default solverstart: e.g.
# START=results/cpu/runs/sokoban_sft/seed_0 START_LABEL=formatstart; set and empty: the base
# model, as gpu_sft.sh's compile warm-ups use). For gpu_sft.sh: RUNS_DIR
# (where the runs go; default here), DEADLINE (seconds into this script after which no run
# starts and the current one is stopped with SIGTERM, saving), EXTRA (more run.py arguments),
# PY (the python; default python).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=${START-$here/sokoban_sft_gpu_solver100/seed_0}
start_label=${START_LABEL:-solverstart}
root=${RUNS_DIR:-$here}
steps=${STEPS:-20}
for run in "$@"; do
    IFS=: read -r estimator seed lr mode rank shape <<< "$run"
    lr=${lr:-2e-5}
    mode=${mode:-mean_std}
    rank=${rank:-0}
    shape=${shape:-4x8}
    groups=${shape%x*}
    size=${shape#*x}
    keep=0.5
    label=${estimator}_s
    if [ "$estimator" = vanilla ]; then
        keep=1.0
        label=vanilla
    fi
    name=sokoban_${label}_${start_label}_${lr}_${shape}_keep${keep}_$steps
    options=()
    if [ "$mode" != mean_std ]; then
        name=${name}_$mode
        options=(--config.advantage.grpo_mode="$mode")
        [ "$estimator" = gigpo ] && options+=(--config.advantage.step_mode="$mode")
    fi
    if [ "$rank" != 0 ]; then
        name=${name}_lora$rank
        options+=(--config.lora.rank="$rank")
    fi
    w=$root/$name/seed_$seed
    suffix=",$estimator"
    [ "$estimator" = grpo ] && suffix=""  # the default method, as the first runs had it
    resume=()
    [ -f "$w/config.json" ] && resume=(--resume)
    limit=()
    if [ -n "${DEADLINE:-}" ]; then
        left=$((DEADLINE - SECONDS))
        [ "$left" -gt 60 ] || { echo "=== no time left for $run"; break; }
        limit=(timeout -s TERM -k 60 "$left")
    fi
    echo "=== $estimator seed $seed lr $lr mode $mode lora rank $rank shape $shape -> $w $(date +%T)"
    "${limit[@]}" ${PY:-python} experiments/run.py \
        --config "$here/sokoban_shape.py:$lr,$groups,$size,$keep,$steps$suffix" \
        --config.model.init_from="$start" --config.seed="$seed" --workdir "$w" \
        "${resume[@]}" "${options[@]}" \
        ${EXTRA:-} || exit 1
done
