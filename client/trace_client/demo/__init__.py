"""The demo: TRACE against uniform allocation at the same budget on the simulated workload."""
