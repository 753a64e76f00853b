"""Benchmarks and measurement scripts (not tests): each prints a table and writes JSON under docs/results/."""
