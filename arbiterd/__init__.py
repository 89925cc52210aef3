"""arbiterd: the node-local GPU time-slice arbiter daemon."""

__version__ = "0.1.0"
