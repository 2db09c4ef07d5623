"""The lab around the service: what tests, benchmarks and the demo run, never what a trainer installs.

- ``trace_lab.sim``: simulated multi-turn workloads and their worker callables;
- ``trace_lab.demo``: ``trace-rollout-demo``, TRACE against uniform on a simulated workload;
- ``trace_lab.local``: a service and a redis-server started locally (processes or threads);
- ``trace_lab.load``: the load and fault-injection fleet;
- ``trace_lab.liveness``: a ``/healthz`` probe thread, hostile request bodies and the requests of one large
  tree, for liveness checks;
- ``trace_lab.verl_dry_run``: the verl integration's CPU dry run, the simulator in place of the inference
  server.

It imports ``trace_client`` (the HTTP client and the worker driver) and, where it runs a service,
``trace_service``; nothing in ``trace_client`` imports it back.
"""
