"""The `kvscale` command line, a module per command group:

- `catalog`: `gpus`, `models`
- `planning`: `plan`, `predict`, `roofline` (its picture in `roofline_plot`)
- `simulate`: `simulate` (its picture in `simulate_plot`)
- `sim_serve`: `sim serve`
- `cluster`: `crd`, `operator`
- `manifests`: `manifests` (the operator's objects for a spec, as YAML; `--diff` against the live ones)
- `status`: `status NAME` (plan, observed, decision, conditions and Events of a live InferenceService)
- `live`: the cluster client `status` and `manifests --diff` share

`common` holds the input checks: bad input exits 2 with a message naming the option and
the fix, never a traceback. Importing a command module registers its commands on `app`.
"""

from __future__ import annotations

from kvscale.cli.app import app

# isort: off
# Registration order is the order of `kvscale --help`.
from kvscale.cli import catalog, planning, simulate, sim_serve, cluster, manifests, status

# isort: on

__all__ = ["app", "catalog", "cluster", "main", "manifests", "planning", "sim_serve", "simulate", "status"]


def main() -> None:
    app()
