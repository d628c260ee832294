"""Workload traces shipped with toolkit (read through importlib.resources): Azure LLM inference 2023 (CC-BY)
and a Mooncake sample."""
