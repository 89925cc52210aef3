"""asyncio shells around the core: client socket, admin API, metrics, systemd glue."""
