"""The fake CUDA driver and NVML, and the CUDA job program: C sources and their build (:mod:`.build`)."""
