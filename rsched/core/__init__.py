"""The pure core: models, specs, cron, retry, ids, errors and settings; no I/O, no Redis."""
