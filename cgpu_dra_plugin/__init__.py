"""cgpu's DRA kubelet plugin: publishes each GPU once, with consumable memory and cores, and prepares claims."""

__version__ = "0.1.0"
DRIVER = "gpu.cgpu.io"  # the DRA driver name: ResourceSlices, DeviceClass selectors, opaque config, CDI vendor
