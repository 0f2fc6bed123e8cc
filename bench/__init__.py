"""Benchmarks: side by side in one run, reported as ratios (JSON, a plot, a table)."""
