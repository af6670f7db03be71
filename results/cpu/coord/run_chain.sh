#!/usr/bin/env bash
# Issue 60's experiment of record on this CPU, resumable: each run resumes its workdir when it
# holds a config.json and is skipped once it finished (a DONE file). Restart it after a session
# ends with the same command:
#     nohup bash results/cpu/coord/run_chain.sh >> results/cpu/coord/log.txt 2>&1 &
# The chain: SmolLM2 -> world-model SFT (coord_sokoban_sft.py, seed 0) -> StarPO-S PPO
# (coord_sokoban_cpu.py) and GRPO with the group mean, 3 seeds each; then the format-only start
# (think-mode answers, no world model) and PPO from it; then the same on CoordFrozenLake.
# Checkpoints stay in the (ignored) checkpoints/ folders; metrics, logs and evaluations are
# committed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
. .venv/bin/activate
R=results/cpu/runs

run() {  # script config workdir [overrides...]: resume or start, then mark DONE
  local script=$1 config=$2 dir=$3
  shift 3
  [ -f "$dir/DONE" ] && return 0
  local resume=()
  if [ -n "$(ls -A "$dir/checkpoints" 2>/dev/null)" ]; then
    resume=(--resume)
  elif [ -f "$dir/config.json" ]; then  # a fresh checkout: its metrics, not its checkpoints
    echo "$dir has no checkpoint here (checkpoints are not committed): starting it over"
    mv "$dir" "$dir.before_$(date -u +%Y%m%dT%H%M%S)"
  fi
  echo "=== $(date -u +%FT%TZ) $script $config -> $dir ${resume[*]} $*"
  python "experiments/$script" --config "$config" --workdir "$dir" "${resume[@]}" "$@" \
    && touch "$dir/DONE"
}

chain() {  # game: the world-model start, PPO and GRPO from it, the format-only start and PPO
  local g=$1
  local wm=$R/${g}_wm_sft/seed_0 fmt=$R/${g}_format_sft/seed_0
  run sft.py "${g}_sft.py" "$wm" --config.val_before_train=False || return 1
  for seed in 0 1 2; do
    run run.py "${g}_cpu.py" "$R/${g}_ppo_s/seed_$seed" --config.seed=$seed \
      --config.model.init_from="$wm" || return 1
  done
  for seed in 0 1 2; do
    run run.py "${g}_cpu.py" "$R/${g}_grpo_s/seed_$seed" --config.seed=$seed \
      --config.model.init_from="$wm" --config.algo=grpo --config.advantage.grpo_mode=mean \
      || return 1
  done
  run sft.py "${g}_sft.py" "$fmt" --config.val_before_train=False \
    --config.sft.reply_format=answer || return 1
  for seed in 0 1 2; do
    run run.py "${g}_cpu.py" "$R/${g}_ppo_s_format_start/seed_$seed" --config.seed=$seed \
      --config.model.init_from="$fmt" || return 1
  done
}

chain coord_sokoban && chain coord_frozen_lake
