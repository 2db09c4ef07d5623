"""`trace-rollout-demo` (or `python -m trace_lab.demo`): TRACE against uniform allocation at the same
budget, on the simulated agentic workload, through the real HTTP API and the worker driver.

With no `--url` the service runs in this process (uvicorn on a free loopback port, the embedded store).
Each policy is one job on a fresh simulated workload (same seed, learning mode: a prompt whose group was
mixed gets easier, as if the policy had trained on it), run for `steps` training steps with the same
pools and budgets. The policies take turns step by step, each its own job with its own predictor (trained on
that job's trees only); after each step the demo gives the service's background loop a moment to train
each job's predictor on the step's trees before the next allocation. At the
end it prints a comparison table (from `GET /v1/jobs/{job}/stats` and `GET /v1/predictor`) and writes
`mixed_per_step.png` and `results.json` under `--out`; with `--json` the results document goes to
stdout and everything else to stderr.

It needs the `demo` extra (`pip install 'trace-rollout[demo]'`: the service, the simulator and
matplotlib); against a running service (`--url`) the `sim` extra is enough (the plot is skipped without
matplotlib).

- `config`: `DemoConfig` and the command-line options that set it.
- `loop`: the run loop (`run`, `run_demo`).
- `report`: per-policy figures, the comparison table, the plot and `results.json`.
- `cli`: the command (`main`).
"""
