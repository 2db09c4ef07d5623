"""Benchmarks: allocation quality (quality.py) and the harness they share (harness.py)."""
