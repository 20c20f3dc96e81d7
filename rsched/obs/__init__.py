"""Observability: Prometheus metrics and log formatting."""
