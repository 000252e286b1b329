"""Issue 38, finding 9: a model cache the spec marks read-only (weights filled in advance) is
mounted read-only, the claim itself too, on every engine pod; without it the engine downloads
into the cache, so the mount stays writable (docs/tenancy.md says what that grants)."""

from __future__ import annotations

from kvscale.control.pod_policy import PodPolicy
from tests.unit.test_pod_security import MODELS, build, build_set, cache_parts, pod_specs, with_


def pvc(read_only: bool | None) -> dict[str, object]:
    cache: dict[str, object] = {"persistentVolumeClaim": "weights"}
    if read_only is not None:
        cache["readOnly"] = read_only
    return with_(model={"name": "llama-3.1-8b", "cache": cache})


def test_a_read_only_claim_is_mounted_read_only() -> None:
    [pod] = pod_specs(build(pvc(True)))
    volume, mount = cache_parts(pod)
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert mount["readOnly"] is True


def test_by_default_the_engine_writes_its_cache() -> None:
    for flag in (None, False):
        [pod] = pod_specs(build(pvc(flag)))
        volume, mount = cache_parts(pod)
        assert volume["persistentVolumeClaim"] == {"claimName": "weights"} and "readOnly" not in mount


def test_read_only_wins_over_a_writable_node_path_policy() -> None:
    policy = PodPolicy(host_path_prefixes=(MODELS,), host_path_writable=True)
    body = with_(model={"name": "llama-3.1-8b", "cache": {"hostPath": f"{MODELS}/m", "readOnly": True}})
    [pod] = pod_specs(build(body, policy))
    volume, mount = cache_parts(pod)
    assert volume["hostPath"] == {"path": f"{MODELS}/m", "type": "Directory"} and mount["readOnly"] is True


def test_every_pod_of_a_group_across_nodes_mounts_it_read_only() -> None:
    body = with_(model={"name": "llama-3.1-405b", "cache": {"persistentVolumeClaim": "weights", "readOnly": True}})
    for pod in pod_specs(build_set(body)):
        volume, mount = cache_parts(pod)
        assert volume["persistentVolumeClaim"]["readOnly"] is True and mount["readOnly"] is True
