"""Kernel micro-benchmarks that need a GPU (each also has a tiny `--dry-run` for CPU)."""
