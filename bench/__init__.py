"""Benchmark suite: each case measures the exporter beside a baseline timed in the same run."""
