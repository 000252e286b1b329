"""Engine pods a tenant with only InferenceService rights cannot escape through (issue 28): locked
down pods, hostPath caches only under allowed prefixes (read-only unless allowed otherwise), an
optional image allowlist, refusals that name the field and the setting; a preStop that outlasts
endpoint propagation; a PodDisruptionBudget that never evicts the only replica or group."""

from __future__ import annotations

import copy
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kvscale.api import labels
from kvscale.api.intent import parse_intent
from kvscale.api.models import InferenceServiceStatus
from kvscale.cli import app
from kvscale.control import leader_worker_set as lws
from kvscale.control import planning
from kvscale.control.inventory import GpuPool, gpu_inventory
from kvscale.control.planning import Planned, plan_service
from kvscale.control.pod_policy import (
    DEFAULT_POLICY,
    NotAllowed,
    PodPolicy,
    canonical_reference,
    image_allowed,
    normal_path,
    under,
)
from kvscale.control.reconcile import DeploymentView, Observed, Resource, reconcile
from kvscale.control.resources import (
    PRE_STOP_SLEEP_S,
    deployment,
    min_available_percent,
    pod_disruption_budget,
)
from kvscale.control.settings import Settings, SettingsError
from kvscale.control.status import get_condition
from kvscale.engines.args import plan_launch
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from tests.cluster.harness import node_objects

CAT = default_catalog()
NODES = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
POOLS = gpu_inventory(CAT, NODES, [])
NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
RES = Resource("tenant", "chat", "uid-1", 1)
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 2},
    "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "80ms"},
    "hardware": {"gpuTypes": ["L4", "A10G", "A100-80GB", "H100-SXM"]},
}
# The issue's finding: a user who cannot create pods asked for the node's root, their own image
# and a preloaded library.
HOSTILE: dict[str, Any] = {
    **SPEC,
    "model": {"name": "llama-3.1-8b", "cache": {"hostPath": "/"}},
    "engine": {"image": "busybox", "env": [{"name": "LD_PRELOAD", "value": "/host/evil.so"}]},
}
MODELS = "/var/lib/kvscale-models"


def with_(base: dict[str, Any] = SPEC, **patch: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def cached(path: str, **patch: Any) -> dict[str, Any]:
    return with_(model={"name": "llama-3.1-8b", "cache": {"hostPath": path}}, **patch)


def build(raw: dict[str, Any], policy: PodPolicy = DEFAULT_POLICY, port: int = 8000) -> dict[str, Any]:
    intent = parse_intent(raw)
    result = plan_service(intent, CAT, POOLS)
    assert isinstance(result, Planned), result.message
    chosen = result.chosen
    return deployment(
        "chat", "uid", intent.spec, result.model, chosen.config, chosen, result.pool, 1, port, policy=policy
    )


H100 = CAT.gpu("H100-SXM")
H100_POOL = GpuPool("H100-SXM", H100.node_labels[0], H100.label_key, H100.resource_name, 32, 0, 8)


def build_set(raw: dict[str, Any], policy: PodPolicy = DEFAULT_POLICY, engine: str = "vllm") -> dict[str, Any]:
    """405B as TP 8 x PP 2 on two H100 nodes, a hand-made plan (as tests/unit/test_leader_worker_set.py)."""
    intent = parse_intent(
        {
            **raw,
            "model": {**raw["model"], "name": "llama-3.1-405b"},
            "engine": {**raw.get("engine", {}), "type": engine},
        }
    )
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-405b"), H100, "bf16", 8, engine=engine, pipeline_parallel=2)
    planned = plan_launch(cfg, "meta-llama/Llama-3.1-405B", 8192, 2304, 64, 100_000, 8000, cached=False)
    return lws.leader_worker_set("big", intent.spec, cfg, planned, H100_POOL, 1, 8000, labels("big"), policy=policy)


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every engine pod template's spec of a Deployment or LeaderWorkerSet."""
    spec = obj["spec"]
    if "leaderWorkerTemplate" in spec:
        t = spec["leaderWorkerTemplate"]
        return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    return [spec["template"]["spec"]]


def cache_parts(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-cache")
    return volume, mount


# --- the pods: no token, no privileges, default seccomp, a preStop ---------------------------


@pytest.mark.parametrize("kind", ["Deployment", "LeaderWorkerSet vllm", "LeaderWorkerSet sglang"])
def test_engine_pods_are_locked_down(kind: str) -> None:
    obj = build(SPEC) if kind == "Deployment" else build_set(SPEC, engine=kind.split()[1])
    for pod in pod_specs(obj):
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        [container] = pod["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        # The engine images run as root and write under /root/.cache: neither is forbidden.
        assert "runAsNonRoot" not in pod["securityContext"]
        assert "readOnlyRootFilesystem" not in container["securityContext"]


def test_a_port_below_1024_keeps_only_the_capability_to_bind_it() -> None:
    [pod] = pod_specs(build(SPEC, port=80))
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}


@pytest.mark.parametrize("kind", ["Deployment", "LeaderWorkerSet"])
def test_pre_stop_sleeps_within_the_grace_period(kind: str) -> None:
    obj = build(SPEC) if kind == "Deployment" else build_set(SPEC)
    for pod in pod_specs(obj):
        # Kubernetes' own sleep action (no `sleep` binary needed in the image).
        assert pod["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}}
        assert 0 < PRE_STOP_SLEEP_S < pod["terminationGracePeriodSeconds"]


# --- hostPath: only under allowed prefixes, normalised, read-only by default -----------------


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("/data/models", "/data/models"),
        ("/data/models/", "/data/models"),
        ("//data//models/./x", "/data/models/x"),
        ("/data/models/../../etc", "/etc"),
        ("/../../", "/"),
        ("data/models", None),
        ("", None),
    ],
)
def test_paths_are_normalised_as_the_kernel_reads_them(path: str, normal: str | None) -> None:
    assert normal_path(path) == normal


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (MODELS, True),
        (f"{MODELS}/llama", True),
        (f"{MODELS}/a/b/c", True),
        (f"{MODELS}/x/../llama", True),
        (f"//{MODELS}//llama", True),
        (f"{MODELS}-evil", False),  # a prefix only on a path-component boundary
        (f"{MODELS}evil/x", False),
        (f"{MODELS}/../../../etc", False),  # `..` escapes are resolved before comparing
        (f"{MODELS}/..", False),
        ("/var/lib", False),
        ("/", False),
        ("/etc/kubernetes", False),
    ],
)
def test_host_path_only_under_an_allowed_prefix(path: str, allowed: bool) -> None:
    normal = normal_path(path)
    assert normal is not None
    assert under(normal, MODELS) is allowed
    policy = PodPolicy(host_path_prefixes=(MODELS, "/mnt/other"))
    if allowed:
        [pod] = pod_specs(build(cached(path), policy))
        volume, _ = cache_parts(pod)
        assert volume["hostPath"]["path"] == normal  # what was checked is what is mounted
    else:
        with pytest.raises(NotAllowed, match=r"spec\.model\.cache\.hostPath: .* not under a directory"):
            build(cached(path), policy)


def test_a_prefix_written_with_a_trailing_slash_or_dots_means_the_same_directory() -> None:
    policy = Settings.from_env({"KVSCALE_HOST_PATH_PREFIXES": f" {MODELS}/ , /mnt/x/../y"}).pod_policy
    assert policy.host_path_prefixes == (MODELS, "/mnt/y")
    assert pod_specs(build(cached(f"{MODELS}/m"), policy))
    with pytest.raises(NotAllowed):
        build(cached("/mnt/x/m"), policy)


@pytest.mark.parametrize("kind", ["Deployment", "LeaderWorkerSet"])
def test_no_host_path_is_allowed_by_default_and_the_refusal_names_the_fix(kind: str) -> None:
    raw = cached(f"{MODELS}/m")
    with pytest.raises(NotAllowed) as refused:
        build(raw) if kind == "Deployment" else build_set(raw)
    message = str(refused.value)
    assert message.startswith("spec.model.cache.hostPath: ")
    assert "KVSCALE_HOST_PATH_PREFIXES" in message and "operator.hostPathPrefixes" in message
    assert "spec.model.cache.persistentVolumeClaim" in message
    assert refused.value.reason == "NotAllowed"


@pytest.mark.parametrize("kind", ["Deployment", "LeaderWorkerSet"])
def test_an_allowed_host_path_is_mounted_read_only_and_must_exist(kind: str) -> None:
    raw = cached(f"{MODELS}/m")
    policy = PodPolicy(host_path_prefixes=(MODELS,))
    obj = build(raw, policy) if kind == "Deployment" else build_set(raw, policy)
    for pod in pod_specs(obj):
        volume, mount = cache_parts(pod)
        # Directory, not DirectoryOrCreate: the kubelet creates nothing on the node.
        assert volume["hostPath"] == {"path": f"{MODELS}/m", "type": "Directory"}
        assert mount["readOnly"] is True


def test_writes_only_where_the_setting_allows_them() -> None:
    policy = Settings.from_env({"KVSCALE_HOST_PATH_PREFIXES": MODELS, "KVSCALE_HOST_PATH_WRITABLE": "true"}).pod_policy
    [pod] = pod_specs(build(cached(f"{MODELS}/m"), policy))
    volume, mount = cache_parts(pod)
    assert volume["hostPath"] == {"path": f"{MODELS}/m", "type": "DirectoryOrCreate"}
    assert "readOnly" not in mount
    # A persistent volume claim is the tenant's own storage: never forced read-only.
    [pod] = pod_specs(build(with_(model={"name": "llama-3.1-8b", "cache": {"persistentVolumeClaim": "w"}})))
    assert "readOnly" not in cache_parts(pod)[1]


# --- images: an optional allowlist ------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "entries", "allowed"),
    [
        ("busybox", (), True),  # no list: any image
        ("vllm/vllm-openai:v0.11.0", ("vllm/vllm-openai",), True),
        ("docker.io/vllm/vllm-openai:v0.12.0", ("vllm/vllm-openai",), True),
        ("index.docker.io/vllm/vllm-openai", ("docker.io/vllm/vllm-openai",), True),
        ("vllm/vllm-openai@sha256:" + "a" * 64, ("vllm/vllm-openai",), True),
        ("vllm/vllm-openai-evil:v1", ("vllm/vllm-openai",), False),
        ("evil.io/vllm/vllm-openai:v0.11.0", ("vllm/vllm-openai",), False),
        ("busybox", ("vllm/vllm-openai",), False),
        ("busybox:1.36", ("docker.io/library/busybox",), True),  # Docker Hub's short form
        ("library/busybox", ("busybox",), True),
        ("vllm/vllm-openai:v0.11.0", ("vllm/vllm-openai:v0.11.0",), True),  # pinned: that tag only
        ("docker.io/vllm/vllm-openai:v0.11.0", ("vllm/vllm-openai:v0.11.0",), True),
        ("vllm/vllm-openai:latest", ("vllm/vllm-openai:v0.11.0",), False),
        ("vllm/vllm-openai", ("vllm/vllm-openai:latest",), True),  # no tag is :latest
        ("r.io/a/b:t@sha256:" + "b" * 64, ("r.io/a/b@sha256:" + "b" * 64,), True),  # the digest is what is pulled
        ("r.io/a/b@sha256:" + "c" * 64, ("r.io/a/b@sha256:" + "b" * 64,), False),
        ("ghcr.io/huggingface/text-generation-inference:3.3.7", ("ghcr.io/huggingface/",), True),
        ("ghcr.io/huggingface-evil/x:1", ("ghcr.io/huggingface/",), False),  # prefix on a component boundary
        ("ghcr.io/huggingface", ("ghcr.io/huggingface/",), False),
        ("lmsysorg/sglang:v0.5", ("lmsysorg/",), True),  # a Docker Hub namespace
        ("busybox", ("lmsysorg/",), False),
        ("busybox", ("docker.io/",), True),  # a whole registry
        ("quay.io/x/y", ("docker.io/",), False),
        ("localhost:5000/x/y:1", ("localhost:5000/",), True),
        ("vllm/vllm-openai:v1/../x", ("vllm/",), False),  # not an image reference at all
        ("VLLM/vllm-openai", ("vllm/",), False),
    ],
)
def test_image_allowlist(image: str, entries: tuple[str, ...], allowed: bool) -> None:
    assert image_allowed(image, entries) is allowed


def test_canonical_references_follow_docker() -> None:
    ref = canonical_reference("busybox")
    assert ref is not None and (ref.repository, ref.reference, ref.pinned) == (
        "docker.io/library/busybox",
        "docker.io/library/busybox:latest",
        False,
    )
    assert canonical_reference("not an image") is None


def test_images_outside_the_list_are_refused_naming_the_field() -> None:
    policy = Settings.from_env({"KVSCALE_ALLOWED_IMAGES": "vllm/vllm-openai,lmsysorg/"}).pod_policy
    assert pod_specs(build(SPEC, policy))  # the catalog's vllm/vllm-openai:v0.11.0
    with pytest.raises(NotAllowed) as refused:
        build(with_(engine={"image": "busybox"}), policy)
    message = str(refused.value)
    assert message.startswith("spec.engine.image: busybox is not an image this operator allows")
    assert "KVSCALE_ALLOWED_IMAGES" in message and "operator.allowedImages" in message
    # The catalog's image is checked too, and the message says where it came from.
    with pytest.raises(NotAllowed, match=r"spec\.engine\.image \(unset: the catalog's image for engine tgi\)"):
        build(with_(engine={"type": "tgi"}), policy)
    with pytest.raises(NotAllowed, match=r"spec\.engine\.image: busybox"):
        build_set(SPEC | {"engine": {"image": "busybox"}}, policy)


def test_the_rocm_image_is_checked_on_amd_gpus() -> None:
    mi300x = {
        "metadata": {"name": "mi300x-0", "labels": {"amd.com/gpu.product-name": "AMD-Instinct-MI300X"}},
        "spec": {},
        "status": {"allocatable": {"amd.com/gpu": "8"}},
    }
    pools = gpu_inventory(CAT, [mi300x], [])
    intent = parse_intent(with_(hardware={"gpuTypes": ["MI300X"]}, engine={"rocmImage": "evil/rocm"}))
    result = plan_service(intent, CAT, pools)
    assert isinstance(result, Planned), result.message
    c = result.chosen
    policy = PodPolicy(allowed_images=("rocm/vllm",))
    with pytest.raises(NotAllowed, match=r"^spec\.engine\.rocmImage: evil/rocm"):
        deployment("chat", "uid", intent.spec, result.model, c.config, c, result.pool, 1, 8000, policy=policy)


def test_every_problem_is_named_at_once() -> None:
    policy = PodPolicy(allowed_images=("vllm/vllm-openai",))
    with pytest.raises(NotAllowed) as refused:
        build(HOSTILE, policy)
    assert "spec.model.cache.hostPath: / " in str(refused.value)
    assert "spec.engine.image: busybox " in str(refused.value)


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("KVSCALE_HOST_PATH_PREFIXES", "relative/dir"),
        ("KVSCALE_HOST_PATH_WRITABLE", "yes"),
        ("KVSCALE_ALLOWED_IMAGES", "not an image"),
        ("KVSCALE_ALLOWED_IMAGES", "vllm/vllm-openai:v1/../x"),
    ],
)
def test_bad_policy_settings_name_the_variable(env: str, value: str) -> None:
    with pytest.raises(SettingsError, match=env):
        Settings.from_env({env: value})


def test_policy_settings_default_to_no_node_path_and_any_image() -> None:
    assert Settings().pod_policy == DEFAULT_POLICY == PodPolicy((), False, ())


# --- reconcile: a refused spec is a condition and an Event; nothing is applied ----------------


def test_the_hostile_spec_is_refused_and_nothing_is_applied() -> None:
    running = DeploymentView(1, 1, "L4", "vllm/vllm-openai:v0.11.0")
    before = InferenceServiceStatus(phase="Ready")
    result = reconcile(HOSTILE, RES, before, Observed(POOLS, running), CAT, Settings(), now=NOW)
    assert result.apply == () and result.delete == () and result.scale_to is None
    assert result.retry is not None and result.retry.delay_s is None  # permanent until the spec changes
    planned = get_condition(result.status, "Planned")
    assert planned is not None and (planned.status, planned.reason) == ("False", "NotAllowed")
    assert (
        planned.message.startswith("spec.model.cache.hostPath: / ") and "KVSCALE_HOST_PATH_PREFIXES" in planned.message
    )
    ready = get_condition(result.status, "Ready")
    assert ready is not None and ready.status == "False"
    assert result.status.phase == "Failed"
    [event] = result.events
    assert (event.type, event.reason) == ("Warning", "NotAllowed") and "spec.model.cache.hostPath" in event.message


def test_reconcile_deploys_under_the_operator_settings() -> None:
    settings = Settings.from_env({"KVSCALE_HOST_PATH_PREFIXES": MODELS, "KVSCALE_ALLOWED_IMAGES": "vllm/"})
    result = reconcile(
        cached(f"{MODELS}/llama"), RES, InferenceServiceStatus(), Observed(POOLS), CAT, settings, now=NOW
    )
    assert [c["kind"] for c in result.apply] == ["Service", "PodDisruptionBudget", "Deployment"]
    assert result.apply[1]["spec"]["minAvailable"] == "50%"
    [pod] = pod_specs(result.apply[-1])
    volume, mount = cache_parts(pod)
    assert volume["hostPath"]["path"] == f"{MODELS}/llama" and mount["readOnly"] is True
    refused = reconcile(
        cached(f"{MODELS}/llama", engine={"image": "busybox"}),
        RES,
        InferenceServiceStatus(),
        Observed(POOLS),
        CAT,
        settings,
        now=NOW,
    )
    assert refused.apply == ()
    planned = get_condition(refused.status, "Planned")
    assert planned is not None and planned.reason == "NotAllowed" and planned.message.startswith("spec.engine.image")


# --- the PodDisruptionBudget -------------------------------------------------------------------


def evictions_allowed(pdb: dict[str, Any], replicas: int, pods_per_replica: int) -> int:
    """What the disruption controller allows with every pod healthy: expected pods from the
    controllers' scale, minAvailable's percentage rounded up (disruption.go getExpectedPodCount,
    intstr.GetScaledValueFromIntOrPercent: math.Ceil(float64(value) * float64(total) / 100))."""
    expected = replicas * pods_per_replica
    percent = int(pdb["spec"]["minAvailable"].rstrip("%"))
    return max(expected - math.ceil(float(percent) * float(expected) / 100), 0)


@pytest.mark.parametrize("pods_per_replica", [1, 2, 3, 4, 8, 16, 32, 64, 99])
def test_the_budget_keeps_a_lone_replica_or_group_at_any_size(pods_per_replica: int) -> None:
    pdb = pod_disruption_budget("chat", pods_per_replica)
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a broken pod never blocks a drain
    assert pdb["spec"]["selector"] == {"matchLabels": labels("chat")}
    assert evictions_allowed(pdb, 1, pods_per_replica) == 0  # the only replica or group stays
    assert evictions_allowed(pdb, 2, pods_per_replica) == 1  # one of two may go
    for groups in range(2, 65):
        allowed = evictions_allowed(pdb, groups, pods_per_replica)
        # Each evicted pod takes at most one group down: about half of them keep serving.
        assert 1 <= allowed <= groups // 2 + math.ceil(groups * pods_per_replica / 100), groups


def test_the_budget_by_hand() -> None:
    assert min_available_percent(1) == 50 and min_available_percent(2) == 75 and min_available_percent(8) == 93
    deployment_pdb = pod_disruption_budget("chat")
    assert [evictions_allowed(deployment_pdb, n, 1) for n in (1, 2, 3, 4, 10)] == [0, 1, 1, 2, 5]
    # Groups of 100 pods or more: no whole percentage keeps one group and frees one of two.
    assert min_available_percent(100) == 100


@pytest.fixture
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The planner's choice made to span two nodes (as tests/unit/test_multinode_operator.py)."""
    real = planning.plan_service

    def planned(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if not isinstance(out, Planned):
            return out
        cfg = replace(out.config, tensor_parallel=8, pipeline_parallel=2)
        return replace(out, chosen=replace(out.chosen, config=cfg))

    monkeypatch.setattr("kvscale.control.reconcile.plan_service", planned)
    yield


def test_reconcile_sizes_the_budget_by_pods_per_group(two_nodes: None) -> None:
    raw = with_(model={"name": "llama-3.1-70b"}, hardware={"gpuTypes": ["H100-SXM"], "maxTensorParallel": 8})
    result = reconcile(raw, RES, InferenceServiceStatus(), Observed(POOLS), CAT, Settings(), now=NOW)
    kinds = {c["kind"]: c for c in result.apply}
    assert "LeaderWorkerSet" in kinds, [c["kind"] for c in result.apply]
    assert kinds["PodDisruptionBudget"]["spec"]["minAvailable"] == "75%"  # groups of 2 pods


# --- kvscale manifests: the same builders, the same settings -----------------------------------


def test_manifests_refuse_a_host_path_by_default_and_take_the_operator_settings(tmp_path: Path) -> None:
    runner = CliRunner()
    body = {"apiVersion": "kvscale.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"}}
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump({**body, "spec": cached(f"{MODELS}/llama")}))
    refused = runner.invoke(app, ["manifests", "-f", str(path)], env={"KVSCALE_HOST_PATH_PREFIXES": ""})
    assert refused.exit_code == 2 and "spec.model.cache.hostPath" in refused.output
    assert "KVSCALE_HOST_PATH_PREFIXES" in refused.output
    for args, env in (
        (["--host-path-prefixes", MODELS], {}),
        ([], {"KVSCALE_HOST_PATH_PREFIXES": MODELS}),
    ):
        out = runner.invoke(app, ["manifests", "-f", str(path), *args], env=env)
        assert out.exit_code == 0, out.output
        dep = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment")
        [pod] = pod_specs(dep)
        assert cache_parts(pod)[1]["readOnly"] is True and pod["automountServiceAccountToken"] is False
    path.write_text(yaml.safe_dump({**body, "spec": with_(engine={"image": "busybox"})}))
    out = runner.invoke(app, ["manifests", "-f", str(path), "--allowed-images", "vllm/vllm-openai"])
    assert out.exit_code == 2 and "spec.engine.image: busybox" in out.output
