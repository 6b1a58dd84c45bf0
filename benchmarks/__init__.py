"""Benchmarks: each prints its figures; docs/benchmarks.md records them. Run from the
repository root as modules (``python -m benchmarks.agent ...``): they share the tests'
support code (tests/support/).
"""
