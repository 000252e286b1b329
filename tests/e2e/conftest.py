"""The e2e fixtures reuse the cluster-level ones (api, namespace)."""

from tests.cluster.conftest import api, namespace

__all__ = ["api", "namespace"]
