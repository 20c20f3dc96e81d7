"""The engine's long-running loops: dispatchers (leases, claims) and workers."""
