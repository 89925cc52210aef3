"""The kubelet's device-plugin API (vendored ``.proto`` files and the Python generated from them).

Everything under this package except ``regen.py`` is generated; edit the ``.proto`` and run
``python -m cgpu_device_plugin.api.regen``.
"""
