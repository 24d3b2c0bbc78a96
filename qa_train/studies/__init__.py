"""Comparing runs: benchmarks, sweeps, reports and the memory planner."""
