"""What the command lines of every cgpu program share: flags made from settings, the config file read under
them, and the start of ``main``. ``arbiterd`` and ``cgpu-device-plugin`` both use it; nothing here imports
grpc, the plugin or the daemon's server."""
