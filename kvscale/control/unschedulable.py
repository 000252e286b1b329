"""Why engine pods wait unscheduled, in the scheduler's own words, and which causes a re-plan
onto another GPU type can fix (pure).

The scheduler writes the cause into the pod's PodScheduled condition (status False, reason
Unschedulable), e.g. "0/8 nodes are available: 4 Insufficient nvidia.com/gpu, 4 node(s) didn't
match Pod's node affinity/selector. preemption: 0/8 nodes are available: ...". Read in
kube-scheduler v1.34.4's source:

- pkg/scheduler/framework/types.go, FitError.Error: "0/N nodes are available:", then either
  the message of the PreFilter plugin that refused the pod for every node (an unbound PVC:
  "pod has unbound immediate PersistentVolumeClaims") or a histogram of the nodes' reasons,
  "<count> <reason>" sorted and joined with ", ", ending in "."; then the PostFilter messages
  (on the test cluster: "no new claims to deallocate, preemption: 0/12 nodes are available: ...").
- framework/runtime/framework.go, RunFilterPlugins: a node's filters stop at the first that
  refuses it, in the default plugins' order (apis/config/v1/default_plugins.go):
  NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, ...
  So a node of the planned GPU product is counted under "Insufficient <resource>"
  (plugins/noderesources/fit.go) only when no taint or selector refused it first, and nodes of
  other products are counted under NodeAffinity's "node(s) didn't match Pod's node
  affinity/selector" (or under a taint they carry).
- plugins/tainttoleration: "node(s) had untolerated taint(s)" (v1.34 no longer names the
  taint; older releases wrote "node(s) had untolerated taint {key: value}"), so the taints are
  named here from the nodes of the planned product and the pod's tolerations.

Only a shortage of the GPU resource itself (every schedulable node of the planned product says
Insufficient <gpu resource>), or no schedulable node of the product left, is a reason to plan
on another GPU type. A taint, a selector, CPU or memory, a volume: another type of GPU would
fail the same way or cost more for nothing, so kvscale says what blocks and how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

SCHEDULE_EFFECTS = ("NoSchedule", "NoExecute")  # the taints the scheduler's filter honours
_HEAD = re.compile(r"^0/(\d+) nodes are available:\s*")
_COUNT = re.compile(r"^(\d+) (.+)$")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def text(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """k8s.io/api core/v1 toleration.go ToleratesTaint: an empty effect or key matches any;
        Exists matches any value, Equal (or no operator) the same value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


def taints_of(node_spec: dict[str, object] | None) -> tuple[Taint, ...]:
    """The taints of a Node's spec that keep pods off (NoSchedule, NoExecute)."""
    raw = (node_spec or {}).get("taints") or []
    out = []
    for t in raw if isinstance(raw, list) else []:
        if isinstance(t, dict) and t.get("effect") in SCHEDULE_EFFECTS and t.get("key"):
            out.append(Taint(str(t["key"]), str(t.get("value") or ""), str(t["effect"])))
    return tuple(out)


def tolerations_of(pod_spec: dict[str, object] | None) -> tuple[Toleration, ...]:
    raw = (pod_spec or {}).get("tolerations") or []
    return tuple(
        Toleration(
            str(t.get("key") or ""), str(t.get("operator") or ""), str(t.get("value") or ""), str(t.get("effect") or "")
        )
        for t in (raw if isinstance(raw, list) else [])
        if isinstance(t, dict)
    )


def untolerated(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> tuple[Taint, ...]:
    held = tuple(tolerations)
    return tuple(t for t in taints if not any(tol.tolerates(t) for tol in held))


def scheduler_reasons(message: str | None) -> tuple[int, str, dict[str, int]] | None:
    """(nodes, PreFilter message or "", {reason: nodes}) from a FitError message; None when the
    message is not the scheduler's "0/N nodes are available: ..." (another scheduler's, or none)."""
    head = _HEAD.match(message or "")
    if head is None or message is None:
        return None
    # The nodes' part ends at the first ". " (its reasons hold dots only inside resource names).
    body = message[head.end() :].split(". ", 1)[0].strip().rstrip(".")
    histogram: dict[str, int] = {}
    for part in body.split(", "):
        counted = _COUNT.match(part.strip())
        if counted is None:  # a PreFilter plugin's message: it applies to every node
            return int(head.group(1)), body, {}
        histogram[counted.group(2)] = histogram.get(counted.group(2), 0) + int(counted.group(1))
    return int(head.group(1)), "", histogram


@dataclass(frozen=True)
class Diagnosis:
    """What keeps a pod off the planned GPU type's nodes: `replan` when another GPU type is the
    fix (the GPUs are short, or no node of the type is left); `reason` is the condition's."""

    replan: bool
    reason: str
    cause: str
    fix: str
    quote: str  # the scheduler's message, as it wrote it

    def says(self) -> str:
        return f'the scheduler: "{self.quote}"' if self.quote else "the scheduler gave no reason"


def diagnose(
    message: str | None,
    gpu_type: str,
    resource: str,
    product_nodes: int,
    taints: Iterable[Taint] = (),
    tolerations: Iterable[Toleration] = (),
) -> Diagnosis:
    """The cause of one pod's wait. `product_nodes`: schedulable nodes of the planned product in
    the inventory (cordoned ones are not); `taints`: theirs; `tolerations`: the pod's."""
    quote = (message or "").strip()
    if product_nodes == 0:
        return Diagnosis(True, "NoGPUNodes", f"no schedulable node with {gpu_type} GPUs is left", "", quote)
    parsed = scheduler_reasons(message)
    if parsed is None:
        fix = "see `kubectl describe pod`: kvscale re-plans only when the scheduler reports the GPUs short"
        return Diagnosis(False, "Unschedulable", "the cause is not the default scheduler's", fix, quote)
    _, prefilter, histogram = parsed
    short = histogram.get(f"Insufficient {resource}", 0)
    if short >= product_nodes:
        cause = f"every {gpu_type} node ({product_nodes}) lacks free {resource}"
        return Diagnosis(True, "WaitingForGPUs", cause, "", quote)
    return _blocked(prefilter, histogram, gpu_type, resource, tuple(taints), tuple(tolerations), quote)


def _blocked(
    prefilter: str,
    histogram: dict[str, int],
    gpu_type: str,
    resource: str,
    taints: tuple[Taint, ...],
    tolerations: tuple[Toleration, ...],
    quote: str,
) -> Diagnosis:
    """A cause other than the GPUs, by the scheduler's reason, with the fix."""
    text = (prefilter or " ".join(histogram)).lower()
    if "persistentvolumeclaim" in text or "persistent volume" in text:
        return Diagnosis(
            False,
            "VolumeNotBound",
            "the pod's volume claim is not bound (spec.model.cache's PersistentVolumeClaim)",
            "create the claim or a StorageClass that provisions it (`kubectl describe pvc`), or change "
            "spec.model.cache",
            quote,
        )
    refused = untolerated(taints, tolerations)
    if refused:  # on the planned product's own nodes (a taint elsewhere is not what blocks)
        return Diagnosis(
            False,
            "UntoleratedTaint",
            f"the {gpu_type} nodes carry taint(s) the engine pods do not tolerate: "
            f"{', '.join(t.text() for t in refused)}",
            "add them to the operator's KVSCALE_EXTRA_TOLERATIONS (the chart's operator.extraTolerations) "
            "or remove them from the nodes (`kubectl taint nodes NODE KEY-`)",
            quote,
        )
    insufficient = sorted(r.removeprefix("Insufficient ") for r in histogram if r.startswith("Insufficient "))
    others = [r for r in insufficient if r != resource]
    if others:
        return Diagnosis(
            False,
            "InsufficientResources",
            f"the {gpu_type} nodes lack free {', '.join(others)} for the engine pod's requests",
            f"free {', '.join(others)} on the {gpu_type} nodes or add nodes; another GPU type is not the fix",
            quote,
        )
    if any("affinity" in r or "selector" in r for r in histogram):
        return Diagnosis(
            False,
            "NodeSelectorMismatch",
            f"no {gpu_type} node matches the engine pod's node selector or affinity",
            "check the nodes' GPU product label (`kubectl get nodes -L nvidia.com/gpu.product`)",
            quote,
        )
    return Diagnosis(False, "Unschedulable", "the scheduler refuses the pod for a reason other than GPUs", "", quote)
