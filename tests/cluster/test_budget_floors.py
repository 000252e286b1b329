"""A GPUBudget's limit cut below the floors, and a pin beyond the budget, on the real cluster
(issue 29): a service behind a plain Service keeps its replica when the limit is cut below
the floors, and `kubectl scale` is held to the budget, which lists and counts the service."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from kvscale.api import GROUP, VERSION
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_budget import deployment_replicas, operator, service, ticked
from tests.cluster.test_operator import condition, create, get

__all__ = ["operator"]  # the module's operator (scale interval 1 s), shared with test_budget

A100 = "A100-80GB"
REFUSED = "RefusedByBudget"


def budget(name: str, namespace: str, limit: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUBudget",
        "metadata": {"name": name},
        "spec": {"limits": {A100: limit}, "selector": {"namespaces": [namespace], "matchLabels": {"tier": "budgeted"}}},
    }


def budget_status(objects: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    status: dict[str, Any] = dict(objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)).get(
        "status", {}
    )
    return status


def floors(objects: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    return next((c for c in budget_status(objects, name).get("conditions", []) if c["type"] == "FloorsKept"), {})


def test_a_limit_cut_below_the_floors_keeps_a_plain_service_at_one_replica(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api)
    name = f"floors-{namespace}"
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget(name, namespace, 2))
    try:
        wait_until(lambda: "allocated" in budget_status(objects, name), 30, "the budget's first status")
        for svc, priority in (("chat", 100), ("batch", 1)):  # minReplicas 1, behind a plain Service
            create(api, namespace, service(svc, priority))
        wait_until(
            lambda: (
                deployment_replicas(api, namespace, "chat") == 1 and deployment_replicas(api, namespace, "batch") == 1
            ),
            90,
            "one replica each on a limit of 2",
        )
        objects.patch_cluster_custom_object(GROUP, VERSION, "gpubudgets", name, {"spec": {"limits": {A100: 1}}})
        lowest = [1]

        def kept() -> bool:
            lowest[0] = min(lowest[0], deployment_replicas(api, namespace, "batch") or 0)
            c = condition(get(api, namespace, "batch"), "HeldByBudget")
            return c.get("reason") == "KeptBeyondLimit" and floors(objects, name).get("status") == "False"

        try:
            wait_until(kept, 60, "batch's condition and the budget's FloorsKept once the limit is cut")
        except TimeoutError as exc:
            said = get(api, namespace, "batch").get("status", {}).get("conditions")
            raise AssertionError(f"{exc}: {said}\n{budget_status(objects, name)}\n{operator.tail()}") from exc
        ticked(operator, namespace, ["chat", "batch"], 6)  # and it stays: six more ticks of each
        lowest[0] = min(lowest[0], deployment_replicas(api, namespace, "batch") or 0)
        assert lowest[0] == 1, "the service behind a plain Service went to zero replicas"
        assert deployment_replicas(api, namespace, "chat") == 1  # the top priority keeps its floor
        c = condition(get(api, namespace, "batch"), "HeldByBudget")
        assert c["status"] == "True" and "no gateway holds its requests at zero" in c["message"]
        said = floors(objects, name)
        assert said["reason"] == "KeptBeyondLimit" and f"{namespace}/batch (priority 1)" in said["message"]
        assert budget_status(objects, name)["allocated"] == {A100: 2}  # what runs, beyond the limit included
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)


def test_a_pin_is_held_to_the_budget_and_counted(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api)
    name = f"pin-{namespace}"
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget(name, namespace, 1))
    try:
        wait_until(lambda: "allocated" in budget_status(objects, name), 30, "the budget's first status")
        create(api, namespace, service("pinned", 1))
        # A pinned service's tick decides nothing (kvscale_decisions_total does not count it): an
        # unbudgeted service ticking at the same interval is the clock that counts its ticks.
        clock = service("clock", 1)
        clock["metadata"]["labels"] = {}
        create(api, namespace, clock)
        wait_until(lambda: deployment_replicas(api, namespace, "pinned") == 1, 90, "its one replica")
        cluster.kubectl("scale", "kvis", "pinned", "--replicas=2", "-n", namespace)
        peak = [1]

        def held() -> bool:
            peak[0] = max(peak[0], deployment_replicas(api, namespace, "pinned") or 0)
            c = condition(get(api, namespace, "pinned"), "HeldByBudget")
            services = [
                (s["name"], s["replicas"], s["wanted"]) for s in budget_status(objects, name).get("services", [])
            ]
            return c.get("reason") == "PinHeldByBudget" and services == [("pinned", 1, 2)]

        try:
            wait_until(held, 60, "the pin held by the budget, listed in its status")
        except TimeoutError as exc:
            said = get(api, namespace, "pinned").get("status", {}).get("conditions")
            raise AssertionError(f"{exc}: {said}\n{budget_status(objects, name)}\n{operator.tail()}") from exc
        ticked(operator, namespace, ["clock"], 6)
        peak[0] = max(peak[0], deployment_replicas(api, namespace, "pinned") or 0)
        assert peak[0] == 1, f"the pinned Deployment asked for {peak[0]} A100s on a budget of 1"
        assert budget_status(objects, name)["allocated"] == {A100: 1}
        c = condition(get(api, namespace, "pinned"), "HeldByBudget")
        assert c["status"] == "True" and "spec.scaling.replicas pins 2" in c["message"]
        # The budget grows: the pin runs whole.
        objects.patch_cluster_custom_object(GROUP, VERSION, "gpubudgets", name, {"spec": {"limits": {A100: 2}}})
        wait_until(lambda: deployment_replicas(api, namespace, "pinned") == 2, 60, "the pin whole once the budget grew")
        wait_until(
            lambda: condition(get(api, namespace, "pinned"), "HeldByBudget").get("reason") == "WithinBudget",
            30,
            "WithinBudget",
        )
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)


def test_services_without_a_gateway_are_refused_rather_than_run_beyond_the_limit(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """Issue 38, finding 2: under {A100-80GB: 2}, services behind plain Services each kept a
    replica beyond the limit (10 A100 for 7 services). One runs, one of the three created after it
    takes the other GPU at its floor, and the other two are refused and say so; the Deployments
    never ask for more than the limit."""
    objects = client.CustomObjectsApi(api)
    name = f"refuse-{namespace}"
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget(name, namespace, 2))
    try:
        wait_until(lambda: "allocated" in budget_status(objects, name), 30, "the budget's first status")
        create(api, namespace, service("first", 1))
        wait_until(lambda: deployment_replicas(api, namespace, "first") == 2, 90, "first's two A100s")
        for svc in ("second", "third", "fourth"):
            create(api, namespace, service(svc, 1))
        names = ("first", "second", "third", "fourth")
        peak = [0]
        refused: list[str] = []

        def settled() -> bool:
            counts = {n: deployment_replicas(api, namespace, n) or 0 for n in names}
            peak[0] = max(peak[0], sum(counts.values()))
            refused[:] = [n for n in names[1:] if counts[n] == 0]
            reasons = [condition(get(api, namespace, n), "HeldByBudget").get("reason") for n in refused]
            return sorted(counts.values()) == [0, 0, 1, 1] and counts["first"] == 1 and reasons == [REFUSED] * 2

        try:
            wait_until(settled, 90, "one replica for first and one other, the other two refused")
        except TimeoutError as exc:
            conditions = {n: condition(get(api, namespace, n), "HeldByBudget") for n in names}
            raise AssertionError(f"{exc}: {conditions}\n{budget_status(objects, name)}\n{operator.tail()}") from exc
        ticked(operator, namespace, list(names), 4)  # and it stays
        counts = {n: deployment_replicas(api, namespace, n) or 0 for n in names}
        peak[0] = max(peak[0], sum(counts.values()))
        assert [counts[n] for n in refused] == [0, 0] and sum(counts.values()) == 2, counts
        assert peak[0] <= 2, f"at most {peak[0]} A100 asked for on a limit of 2"
        c = condition(get(api, namespace, refused[0]), "HeldByBudget")
        assert c["status"] == "True" and f"budget {name} has no room for one replica" in c["message"]
        said = floors(objects, name)
        assert said["reason"] == REFUSED and all(f"{namespace}/{n} (priority 1)" in said["message"] for n in refused)
        assert budget_status(objects, name)["allocated"] == {A100: 2}
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)


def test_a_catch_all_budget_on_another_gpu_type_leaves_a_teams_budget_in_force(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """Issue 38, finding 1: a catch-all `{H100-SXM: 0}` with no selector became the governing
    budget of every service (the tightest by the sum of its limits), and a team's A100 budget
    then limited nothing. Each GPU type is bounded by the tightest budget that limits it."""
    objects = client.CustomObjectsApi(api)
    team, cap = f"team-{namespace}", f"h100-cap-{namespace}"
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget(team, namespace, 2))
    catch_all = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUBudget", "metadata": {"name": cap}}
    objects.create_cluster_custom_object(
        GROUP, VERSION, "gpubudgets", {**catch_all, "spec": {"limits": {"H100-SXM": 0}}}
    )
    try:
        wait_until(
            lambda: "allocated" in budget_status(objects, team) and "allocated" in budget_status(objects, cap),
            30,
            "both budgets' first status",
        )
        names = ("chat", "batch")  # each wants five A100s (30 req/s), minReplicas 1
        for svc in names:
            create(api, namespace, service(svc, 1))
        peak = [0]

        def shared() -> bool:
            counts = [deployment_replicas(api, namespace, n) or 0 for n in names]
            peak[0] = max(peak[0], sum(counts))
            return counts == [1, 1]

        try:
            wait_until(shared, 90, "one A100 each, the team's limit of 2 shared")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {budget_status(objects, team)}\n{operator.tail()}") from exc
        ticked(operator, namespace, list(names), 4)
        counts = [deployment_replicas(api, namespace, n) or 0 for n in names]
        peak[0] = max(peak[0], sum(counts))
        assert counts == [1, 1] and peak[0] <= 2, f"{counts}, at most {peak[0]} A100 asked for on a limit of 2"
        assert budget_status(objects, team)["allocated"] == {A100: 2}
        capped = budget_status(objects, cap)
        assert capped["allocated"] == {"H100-SXM": 0} and capped.get("services", []) == []
        c = condition(get(api, namespace, "chat"), "HeldByBudget")
        assert c["status"] == "True" and c["message"].startswith(f"budget {team}:")
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", cap)
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", team)
