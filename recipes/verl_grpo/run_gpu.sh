#!/usr/bin/env bash
# GRPO on one GPU node with verl's trainer and the fastrl rollout. Usage:
#   MODEL=/path/to/hf-checkpoint TRAIN=/path/train.parquet VAL=/path/val.parquet GPUS=8 recipes/verl_grpo/run_gpu.sh [key=value ...]
# Needs `pip install -e ".[verl]"` (verl 0.9.1) and verl's GPU stack (FSDP); never run by CI (no GPU there).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL:?set MODEL to a local HF checkpoint directory}"
: "${TRAIN:?set TRAIN to a parquet file in the RL dataset format of verl}"
: "${VAL:=$TRAIN}"
: "${GPUS:=8}"
# The verl.plugins entry point registers fastrl in a pip install; this also covers source checkouts.
export VERL_USE_EXTERNAL_MODULES=fastrl.integrations.verl.plugin
python -m verl.trainer.main_ppo \
  --config-path "$PWD/recipes/verl_grpo/config" --config-name fastrl_grpo \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$TRAIN" data.val_files="$VAL" \
  trainer.n_gpus_per_node="$GPUS" trainer.nnodes=1 \
  trainer.logger='["console"]' trainer.project_name=fastrl_verl trainer.experiment_name=grpo \
  "$@"
