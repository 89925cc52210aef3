"""Operator command-line tools: cgpuctl and cgpu-smi."""
