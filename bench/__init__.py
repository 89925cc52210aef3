"""Benchmarks: shares (simulated core), overhead, load and the ResNet-50 1:2 run."""
