"""cgpu's Kubernetes device plugin: sells GPU memory (GiB) and GPU-core percentages on arbiterd."""

__version__ = "0.1.0"
