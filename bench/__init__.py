"""Benchmarks: each measures the bridge beside raw tinygrad and numpy in one process (`devbridge bench`)."""
