"""The kubelet's DRA and plugin-registration APIs (vendored ``.proto`` files and the Python generated from them).

Everything under this package except ``regen.py`` is generated; edit the ``.proto`` and run
``python -m cgpu_dra_plugin.api.regen``.
"""
