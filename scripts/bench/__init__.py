"""Parts of scripts/benchmark.py: workloads, contenders, timing, report."""
