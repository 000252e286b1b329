"""The serving stand-in for cluster tests: simulated engines behind real pods and a real Prometheus."""
