"""Benchmarks: allocation quality (quality.py) and learning speed (learning.py) on the workload families,
the in-process harness they share (harness.py), and the service's speed and faults (service.py, load.py)."""
