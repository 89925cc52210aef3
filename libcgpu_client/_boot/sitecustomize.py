"""Put on PYTHONPATH by cgpu-run: activates cgpu in every Python process it starts."""

from libcgpu_client.boot import boot

boot(__name__)
