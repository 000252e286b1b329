"""`kvscale manifests`: the objects the operator would create for an InferenceService (the same
planner and builders), as multi-document YAML for review and GitOps."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from kvscale.api.crd import DNS_LABEL_1035, MAX_NAME_LENGTH
from kvscale.cli.common import EXIT_BAD_INPUT, EXIT_INFEASIBLE, CatalogOpt, GpuNodes, fail, gpu_nodes, load
from kvscale.cli.live import KubeconfigOpt, Live, NamespaceOpt
from kvscale.cli.root import app
from kvscale.sizing.catalog import Catalog, load_yaml_all

if TYPE_CHECKING:
    from kvscale.api.intent import Intent
    from kvscale.control.planning import PoolsPlanned
    from kvscale.control.pod_policy import PodPolicy


def gpu_pools(catalog: Catalog, text: str | None, max_replicas: int) -> dict[str, Any]:
    """--gpus TYPE=COUNT or TYPE=NODESxGPUS,... as the operator's inventory (each node's free
    GPUs: the planner sizes a type's node to the largest, so a replica's tensor-parallel group
    never spans nodes); without it, every catalog type with room for maxReplicas full nodes."""
    from kvscale.control.inventory import GpuPool

    def pool(name: str, nodes: GpuNodes) -> GpuPool:
        gpu = catalog.gpu(name)
        return GpuPool(
            gpu_type=gpu.name,
            product_label=gpu.node_labels[0],
            label_key=gpu.label_key,
            resource_name=gpu.resource_name,
            allocatable=nodes.count,
            requested=0,
            max_per_node=nodes.max_per_node,
            free_by_node=nodes.by_node,
        )

    if text is None:
        return {
            g.name: pool(g.name, GpuNodes((g.max_gpus_per_node,) * max_replicas, shaped=False))
            for g in catalog.gpus.values()
        }
    return {name: pool(name, nodes) for name, nodes in gpu_nodes(catalog, text).items()}


def assumed_inventory(gpus: str | None) -> str:
    """What the plan assumed about the cluster, for the output's first line."""
    if gpus is None:
        return (
            "inventory assumed: any catalog GPU type, as many as maxReplicas needs (no --gpus); the operator "
            "plans on the cluster's nodes, so give --gpus TYPE=COUNT or TYPE=NODESxGPUS (e.g. --gpus H100-SXM=16 "
            "or --gpus L4=8x1 for eight one-GPU nodes) to match it"
        )
    return f"inventory assumed: {gpus.replace(' ', '')} free (--gpus)"


def _notes(name: str, spec: Any, launch: Any, cfg: Any) -> list[str]:
    """What the objects need that they do not create: the token Secret, a durable cache."""
    from kvscale.control.resources import cache_size_limit
    from kvscale.sizing.checkpoints import known_gated

    notes = []
    source = launch.checkpoint.source
    secret = spec.model.credentials_secret
    if secret:
        notes.append(
            f"{name}: needs Secret {secret} in its namespace, created by you; its keys become the engine's "
            f"environment, e.g. kubectl create secret generic {secret} --from-literal=HF_TOKEN=hf_..."
        )
    elif known_gated(source):
        notes.append(
            f"WARNING {name}: {source} is a gated Hugging Face repository and spec.model.credentialsSecret is not "
            "set: the download will be refused; set it to a Secret with key HF_TOKEN (a token of an account that "
            "accepted the model's license)"
        )
    if spec.model.cache is None:
        size_gb = launch.checkpoint.size_bytes(cfg.model) / 1e9
        notes.append(
            f"{name}: the model cache is an emptyDir (sizeLimit {cache_size_limit(launch.checkpoint.size_bytes(cfg.model))}): "
            f"every new pod downloads {size_gb:.0f} GB again; a PersistentVolumeClaim "
            "(spec.model.cache.persistentVolumeClaim) is recommended"
        )
    return notes


def _documents(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [d for d in load_yaml_all(path.read_text()) if d is not None]
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"-f {path}: cannot read it: {exc}")
    except yaml.YAMLError as exc:
        fail(f"-f {path}: not YAML: {' '.join(str(exc).split())}")
    services = [d for d in docs if isinstance(d, dict) and d.get("kind") == "InferenceService"]
    if not services:
        fail(f"-f {path}: no InferenceService in it (kind: InferenceService, apiVersion: kvscale.io/v1alpha1)")
    for doc in services:
        meta = doc.get("metadata")
        if not isinstance(meta, dict):
            fail(f"-f {path}: metadata must be a mapping with a name (metadata: {{name: my-model}})")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            fail(f"-f {path}: metadata.name is required")
        if len(name) > MAX_NAME_LENGTH or not re.match(DNS_LABEL_1035, name):
            fail(
                f"-f {path}: metadata.name {name!r} must be at most {MAX_NAME_LENGTH} characters of lowercase "
                "letters, digits and '-', starting with a letter (the API server refuses it otherwise)"
            )
        if not isinstance(meta.get("namespace", ""), str):
            fail(f"-f {path}: {name}: metadata.namespace must be a string")
        if not isinstance(doc.get("spec"), dict):
            fail(f"-f {path}: {name}: spec is required")
    return services


def objects_for(
    doc: dict[str, Any],
    catalog: Catalog,
    gpus: str | None,
    port: int,
    tolerations: tuple[dict[str, str], ...] = (),
    policy: PodPolicy | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The children the operator would apply for one InferenceService document, and a one-line
    summary; exits 2 naming the field for specs the operator would refuse (`policy`: the
    operator's hostPath and image settings; default: its defaults)."""
    from kvscale.api.intent import SpecError, parse_intent
    from kvscale.control import leader_worker_set as lws
    from kvscale.control.inference_pool import inference_pool
    from kvscale.control.planning import PoolsPlanned, Unplanned, plan_layout, plan_service, precheck
    from kvscale.control.pod_policy import DEFAULT_POLICY
    from kvscale.control.resources import (
        EngineImageError,
        NotAllowed,
        deployment,
        labels,
        planned_launch,
        pod_disruption_budget,
        pod_labels,
        service,
    )

    meta = doc.get("metadata") or {}
    name = str(meta["name"])
    try:
        intent = parse_intent(doc["spec"])
    except SpecError as exc:
        fail(f"{name}: {exc.message}")
    refused = precheck(name, intent, catalog)  # what the operator refuses before planning
    if refused is not None:
        fail(f"{name}: {refused.message}")
    spec = intent.spec
    pools = gpu_pools(catalog, gpus, spec.scaling.max_replicas)
    result = plan_layout(intent, catalog, pools, (), plan_service(intent, catalog, pools))
    if isinstance(result, Unplanned):
        fail(f"{name}: {result.message}", EXIT_INFEASIBLE if result.retry else EXIT_BAD_INPUT)
    if isinstance(result, PoolsPlanned):  # spec.serving.disaggregation: a prefill and a decode pool
        return _pool_objects(name, meta.get("namespace"), intent, result, port, tolerations, policy)
    chosen = result.chosen
    cfg = chosen.config
    launch = planned_launch(spec, cfg, chosen.prediction.max_batch, chosen.prediction.kv_cache_tokens, port)
    multi = cfg.nodes > 1
    shape = (
        f"{chosen.prediction.replicas} group(s) of {cfg.nodes} nodes x {cfg.gpus_per_node} {chosen.gpu} "
        f"(TP{cfg.tensor_parallel} x PP{cfg.pipeline_parallel}, {chosen.precision}, a LeaderWorkerSet)"
        if multi
        else f"{chosen.prediction.replicas} x {cfg.gpus} {chosen.gpu} ({chosen.precision})"
    )
    summary = (
        f"{name}: {shape}, max batch {chosen.prediction.max_batch}, requests up to "
        f"{launch.context.max_model_len_tokens} tokens, ${chosen.prediction.cost_usd_per_hour:.2f}/h"
    )
    summary += "".join(f"\n{note}" for note in _notes(name, spec, launch, chosen.config))
    if spec.scaling.mode == "recommend":
        return [], summary + " (mode recommend: the operator creates nothing)"
    pinned = intent.scaling.pinned_replicas
    replicas = pinned if pinned is not None else intent.scaling.bounded(chosen.prediction.replicas)
    too_long = lws.name_problem(name) if multi else None
    if too_long is not None:
        fail(f"{name}: {too_long}")
    # Across nodes only the leaders serve: the Service and the pool select them.
    serving = lws.leader_labels(name) if multi else labels(name)
    pool = pools[chosen.gpu]
    policy = policy or DEFAULT_POLICY
    try:
        workload = (
            lws.leader_worker_set(
                name, spec, cfg, launch, pool, replicas, port, pod_labels(name, "", cfg), tolerations, policy=policy
            )
            if multi
            else deployment(
                name,
                "",
                spec,
                result.model,
                cfg,
                chosen,
                pool,
                replicas,
                port,
                tolerations,
                policy=policy,
                launch=launch,
            )
        )
    except (EngineImageError, NotAllowed, lws.MultiNodeUnsupported) as exc:
        fail(f"{name}: {exc}")
    children = [workload, service(name, port, serving if multi else None), pod_disruption_budget(name, cfg.nodes)]
    routing = spec.routing.inference_pool if spec.routing else None
    if routing is not None:
        children.append(inference_pool(name, routing, serving, port))
    namespace = meta.get("namespace")
    for child in children:
        if namespace:
            child["metadata"]["namespace"] = namespace
    return children, summary


def _pool_objects(
    name: str,
    namespace: str | None,
    intent: Intent,
    planned: PoolsPlanned,
    port: int,
    tolerations: tuple[dict[str, str], ...],
    policy: PodPolicy | None,
) -> tuple[list[dict[str, Any]], str]:
    """A disaggregated plan's children, as the operator builds them (kvscale.control.disaggregated)."""
    from kvscale.control import disaggregated as pd
    from kvscale.control.inference_pool import inference_pool
    from kvscale.control.pod_policy import DEFAULT_POLICY
    from kvscale.control.resources import EngineImageError, NotAllowed, labels, pod_disruption_budget, service
    from kvscale.sizing.checkpoints import CheckpointError
    from kvscale.sizing.context_limit import ContextLimitError

    spec, plan = intent.spec, planned.plan
    problem = pd.engine_args_problem(spec)
    if problem is not None:
        fail(f"{name}: {problem}")
    try:
        launched = pd.launches(spec, plan, port)
    except (CheckpointError, ContextLimitError) as exc:
        fail(f"{name}: {exc}")
    replicas = pd.pool_replicas(plan, intent.scaling.bounded, intent.scaling.pinned_replicas)
    summary = f"{name}: disaggregated, {pd.summary(plan, replicas)}"
    if spec.scaling.mode == "recommend":
        return [], summary + " (mode recommend: the operator creates nothing)"
    try:
        children = list(
            pd.pool_deployments(
                name,
                "",
                spec,
                plan,
                planned.pools,
                launched,
                replicas,
                port,
                tolerations,
                policy=policy or DEFAULT_POLICY,
            )
        )
    except (EngineImageError, NotAllowed) as exc:
        fail(f"{name}: {exc}")
    children += [service(name, port, pd.role_labels(name, pd.SERVING_ROLE)), pod_disruption_budget(name)]
    routing = spec.routing.inference_pool if spec.routing else None
    if routing is not None:
        children.append(inference_pool(name, routing, labels(name), port))  # both roles, as llm-d's P/D
        children.append(pd.picker_config_map(name))  # for the endpoint picker the user runs
    for child in children:
        if namespace:
            child["metadata"]["namespace"] = namespace
    return children, summary


@app.command()
def manifests(
    file: Annotated[Path, typer.Option("--file", "-f", help="YAML file with one or more InferenceServices.")],
    gpus: Annotated[
        str | None,
        typer.Option(
            help="The cluster's free GPUs, TYPE=COUNT (on nodes of the catalog's size) or TYPE=NODESxGPUS (NODES "
            "nodes of GPUS each, shapes joined by +), comma-separated (e.g. H100-SXM=16,L4=8x1): a replica's "
            "tensor-parallel group fits in one node; default: any catalog type."
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="Engine port (the operator's KVSCALE_ENGINE_PORT).")] = 8000,
    tolerations: Annotated[
        str | None,
        typer.Option(
            envvar="KVSCALE_EXTRA_TOLERATIONS",
            help="Extra taints the engine pods tolerate, key[=value]:Effect,... (the operator's "
            "KVSCALE_EXTRA_TOLERATIONS, read from the environment too).",
        ),
    ] = None,
    host_path_prefixes: Annotated[
        str | None,
        typer.Option(
            envvar="KVSCALE_HOST_PATH_PREFIXES",
            help="Node directories a spec.model.cache.hostPath may be under, comma-separated (the operator's "
            "KVSCALE_HOST_PATH_PREFIXES, read from the environment too); default: none.",
        ),
    ] = None,
    host_path_writable: Annotated[
        str | None,
        typer.Option(
            envvar="KVSCALE_HOST_PATH_WRITABLE",
            help="true: mount an allowed hostPath cache read-write (the operator's KVSCALE_HOST_PATH_WRITABLE); "
            "default false.",
        ),
    ] = None,
    allowed_images: Annotated[
        str | None,
        typer.Option(
            envvar="KVSCALE_ALLOWED_IMAGES",
            help="Images engines may run, comma-separated repositories, references or prefixes ending in / (the "
            "operator's KVSCALE_ALLOWED_IMAGES); default: any.",
        ),
    ] = None,
    diff: Annotated[
        bool,
        typer.Option(
            "--diff",
            help="Compare with the live objects in the cluster of the kubeconfig instead of printing them: a unified "
            "diff of the fields kvscale sets, per object, less spec.replicas (the autoscaler's at runtime); exits 1 "
            "when something differs (as kubectl diff).",
        ),
    ] = False,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """The objects the operator would create for an InferenceService (Deployment, or a
    LeaderWorkerSet for a plan across nodes; Service, PodDisruptionBudget, InferencePool), from
    the same planner and builders, as YAML. The operator adds owner references and the owner-uid
    pod label when it applies them."""
    if not 0 < port <= 65535:
        fail(f"--port must be in 1..65535, got {port}")
    if not diff and (namespace is not None or kubeconfig is not None):
        fail("--namespace and --kubeconfig go with --diff (the live objects to compare with)")
    from kvscale.control.settings import Settings, SettingsError, parse_tolerations

    try:
        extra = parse_tolerations(tolerations or "", "--tolerations")
        policy = Settings.from_env(
            {
                "KVSCALE_HOST_PATH_PREFIXES": host_path_prefixes or "",
                "KVSCALE_HOST_PATH_WRITABLE": host_path_writable or "false",
                "KVSCALE_ALLOWED_IMAGES": allowed_images or "",
            }
        ).pod_policy
    except SettingsError as exc:
        fail(str(exc))
    cat = load(catalog)
    out: list[dict[str, Any]] = []
    summaries = []
    for doc in _documents(file):
        children, summary = objects_for(doc, cat, gpus, port, extra, policy)
        out.extend(children)
        summaries.append(summary)
    header = "".join(f"# {line}\n" for text in [*summaries, assumed_inventory(gpus)] for line in text.splitlines())
    if not diff:
        sys.stdout.write(header + (yaml.safe_dump_all(out, sort_keys=False) if out else ""))
        return
    live = Live(kubeconfig)
    text, differs = diff_live(out, live, namespace or live.namespace)
    sys.stdout.write(header + text)
    if differs:
        raise typer.Exit(1)


def project(live: Any, rendered: Any) -> Any:
    """The live value cut down to the fields `rendered` sets: the server's defaults, status,
    managedFields and the operator's own additions (owner references, the owner-uid label) are
    not differences."""
    if isinstance(rendered, dict) and isinstance(live, dict):
        return {k: project(live[k], v) for k, v in rendered.items() if k in live}
    if isinstance(rendered, list) and isinstance(live, list) and len(rendered) == len(live):
        return [project(one, other) for one, other in zip(live, rendered, strict=True)]
    return live


# Fields the operator sets at runtime, not from the spec: the autoscaler scales the Deployment
# (or the LeaderWorkerSet's groups) between spec.scaling's bounds, so a live count that is not
# the plan's starting count is the autoscaler at work, not drift.
RUNTIME_OWNED: dict[str, tuple[str, ...]] = {"Deployment": ("replicas",), "LeaderWorkerSet": ("replicas",)}


def without_runtime_owned(kind: str, obj: Any) -> tuple[Any, dict[str, Any]]:
    """`obj` less the spec fields the operator owns at runtime for `kind` (RUNTIME_OWNED), and
    those fields' values (to say what was left out)."""
    owned = RUNTIME_OWNED.get(kind, ())
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not owned or not isinstance(spec, dict):
        return obj, {}
    cut = {k: spec[k] for k in owned if k in spec}
    return {**obj, "spec": {k: v for k, v in spec.items() if k not in owned}}, cut


def _ignored_note(kind: str, live: dict[str, Any], rendered: dict[str, Any]) -> str:
    """What the diff left out of `kind` and why ('' for a kind with no runtime-owned fields)."""
    fields = RUNTIME_OWNED.get(kind, ())
    if not fields:
        return ""
    said = ", ".join(
        f"spec.{f} (live {live.get(f, '-')}, a fresh plan starts at {rendered.get(f, '-')})" for f in fields
    )
    return f" (not compared: {said}: the operator's autoscaler sets it at runtime)"


def diff_live(objects: list[dict[str, Any]], live: Live, namespace: str) -> tuple[str, bool]:
    """A unified diff per object, live (---) against what kvscale would apply (+++), and whether
    anything differs. Fields the operator owns at runtime (RUNTIME_OWNED: the replica count the
    autoscaler sets) are left out of both sides and named in the object's line."""
    import difflib

    parts: list[str] = []
    differs = False
    for obj in objects:
        meta = obj["metadata"]
        ns = meta.get("namespace") or namespace
        kind, name = obj["kind"], meta["name"]
        current = live.get(obj["apiVersion"], kind, ns, name)
        label = f"{kind} {ns}/{name}"
        if current is None:
            differs = True
            parts.append(f"# {label}: not in the cluster; would be created\n")
            continue
        whole = {**obj, "metadata": {**meta, "namespace": ns}}
        rendered, rendered_owned = without_runtime_owned(kind, whole)
        projected, live_owned = without_runtime_owned(kind, project(current, whole))
        note = _ignored_note(kind, live_owned, rendered_owned)
        before = yaml.safe_dump(projected, sort_keys=False).splitlines(keepends=True)
        after = yaml.safe_dump(rendered, sort_keys=False).splitlines(keepends=True)
        lines = list(difflib.unified_diff(before, after, f"live {label}", f"kvscale manifests {label}"))
        if lines:
            differs = True
            parts.append((f"# {label}:{note}\n" if note else "") + "".join(lines))
        else:
            parts.append(f"# {label}: no differences{note}\n")
    return "".join(parts), differs
