"""Benchmarks: run as modules from the repository root, e.g. ``python -m bench.bench_exporter``.

Each benchmark measures a floor in the same run and prints ratios against it; none is a test.
"""
