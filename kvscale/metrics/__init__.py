"""Prometheus in: an HTTP API client, PromQL builders and engine metric adapters."""
