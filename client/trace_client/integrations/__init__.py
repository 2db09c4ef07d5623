"""Integrations: TRACE wired into a trainer's own extension points, so its stock training loop runs with
TRACE's allocation and advantages.

- `verl`: verl's v1 trainer (`trainer.use_v1`), through its agent-loop manager, agent-loop and
  advantage-estimator registries (needs verl installed: `pip install 'trace-rollout[verl]'`).
- `trl`: TRL's `GRPOTrainer`, through its `rollout_func` and a reward function that hands it TRACE's
  advantages (needs TRL installed: `pip install 'trace-rollout[trl]'`).

The adapters (`trace_client.adapters`) only convert finished trees into a framework's batch format; an
integration also runs the trees where the framework hands out its prompts.
"""
