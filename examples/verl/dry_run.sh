#!/usr/bin/env bash
# The verl side of a TRACE training step on a CPU, end to end: starts a trace-rollout service (embedded
# store) on a free port, runs verl's agent-loop workers, TransferQueue, replay buffer, advantage step and
# step metrics with the simulator generating the turns, and stops the service. Extra arguments go to the
# dry run (--steps, --pool, --budget, --expansion, --seed, --mode colocate_async).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TRACE_DATA_DIR= trace-rollout serve --port "$port" > "${TMPDIR:-/tmp}/trace-verl-dry-run.log" 2>&1 &
service=$!
trap 'kill "$service" 2>/dev/null; wait "$service" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=1)" \
    2>/dev/null && break
  sleep 0.2
done
# verl warns at import about the training engines a CPU machine lacks; they play no part here
python -W ignore::UserWarning -m trace_lab.verl_dry_run --url "http://127.0.0.1:$port" "$@"
