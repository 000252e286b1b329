"""The operator's pure control core: planning a service, building its children, reconcile,
refresh and re-plan, the scale tick's stages, and the status they write. Functions here take
typed values and return results; kopf, the Kubernetes client and HTTP stay in
kvscale.operator, which reads the cluster, calls in here, and applies what comes back."""
