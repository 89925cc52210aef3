"""libcgpu_client: the in-container half of cgpu.

It asks ``arbiterd`` for slice leases before GPU work runs (:class:`Gate`),
keeps the process inside its instance's memory limit, and interposes
frameworks (``libcgpu_client.torch``) so that applications need no change.
"""

__version__ = "0.1.0"
