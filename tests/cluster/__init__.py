"""A real Kubernetes control plane for the tests: etcd, API server, controller manager,
scheduler and kwok (simulated GPU nodes), plus a real Prometheus and helm."""
