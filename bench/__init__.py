"""Benchmarks of amc's own code against same-run baselines (`python -m bench [--smoke]`)."""
