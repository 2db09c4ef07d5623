#!/usr/bin/env bash
# GRPO with TRACE on verl's v1 trainer (GPU machine, verl with vLLM or SGLang installed). Start the service
# first (`trace-rollout serve`, or `docker compose -f deploy/compose.yaml up -d --build`). MODEL, DATA
# (a directory with verl's train.parquet and test.parquet) and TRACE_URL are read from the environment;
# any other verl override can be appended to the command line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${MODEL:?set MODEL to a model path or hub name}"
: "${DATA:?set DATA to the directory with train.parquet and test.parquet}"
python -m verl.trainer.main_ppo --config-path "$here" --config-name trace_grpo \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size="${POOL:-256}" \
  actor_rollout_ref.rollout.n="${ROLLOUTS_PER_PROMPT:-4}" \
  actor_rollout_ref.rollout.name="${ROLLOUT_ENGINE:-vllm}" \
  actor_rollout_ref.actor.ppo_mini_batch_size="${MINI_BATCH:-64}" \
  trace.url="${TRACE_URL:-http://localhost:8000}" \
  trace.budget="${BUDGET:-512}" \
  "$@"
