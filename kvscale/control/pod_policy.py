"""What an InferenceService may ask of a node: which node paths its model cache may mount (and
whether writable), and which container images may run. Pure: values in, a verdict out.

A user with only InferenceService rights must not get, through the operator's pods, what the
API server would refuse them directly (issue 28: `spec.model.cache.hostPath: /` mounted the
node's root read-write). So the operator settings decide, and the defaults allow no node path
at all and any image (the pods are locked down either way: see resources.ENGINE_POD_SECURITY).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

REASON = "NotAllowed"  # the condition's and the Event's reason

HOST_PATH_FIELD = "spec.model.cache.hostPath"
PREFIXES_FIX = "the operator setting KVSCALE_HOST_PATH_PREFIXES (chart value operator.hostPathPrefixes)"
IMAGES_FIX = "the operator setting KVSCALE_ALLOWED_IMAGES (chart value operator.allowedImages)"

# Docker's reference grammar, from github.com/distribution/reference v0.6.0 regexp.go (the parser
# containerd and the kubelet use): [domain[:port]/]path[:tag][@digest].
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)
_PREFIX = re.compile(rf"(?:{_DOMAIN}|{_NAME})/", re.ASCII)


class NotAllowed(ValueError):
    """The spec asks for what the operator settings do not allow; the message names each field
    and the setting (and chart value) that would allow it."""

    reason = REASON


@dataclass(frozen=True)
class PodPolicy:
    """`host_path_prefixes`: normalised absolute directories a hostPath cache may be under (empty:
    none may be used). `host_path_writable`: mount it read-write (default read-only).
    `allowed_images`: image references or repository prefixes (ending in /) engines may run
    (empty: any image)."""

    host_path_prefixes: tuple[str, ...] = ()
    host_path_writable: bool = False
    allowed_images: tuple[str, ...] = ()


DEFAULT_POLICY = PodPolicy()  # the operator's defaults: no node path, any image


def normal_path(path: str) -> str | None:
    """The absolute path `path` names, with `.`, `..` and repeated slashes resolved as the kernel
    resolves them lexically (`..` above / stays at /); None when it is not absolute. Symbolic
    links on the node cannot be seen from here: see host_path_writable's setting."""
    if not path.startswith("/"):
        return None
    # posixpath keeps a leading "//" (POSIX leaves it implementation-defined; Linux reads it as /).
    return "/" + posixpath.normpath(path).lstrip("/")


def under(path: str, prefix: str) -> bool:
    """Whether normalised `path` is `prefix` or inside it, on a path-component boundary:
    /data/models allows /data/models/x, not /data/models-evil."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def parse_prefixes(text: str) -> tuple[str, ...]:
    """KVSCALE_HOST_PATH_PREFIXES: comma-separated absolute directories, normalised."""
    out = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        normal = normal_path(item)
        if normal is None:
            raise ValueError(f"{item!r} is not an absolute path (such as /var/lib/kvscale-models)")
        out.append(normal)
    return tuple(out)


def parse_images(text: str) -> tuple[str, ...]:
    """KVSCALE_ALLOWED_IMAGES: comma-separated image references (a repository allows any tag or
    digest of it; with a tag or digest, that one only) or prefixes ending in / (every repository
    under them, e.g. ghcr.io/my-org/)."""
    out = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        if not (_PREFIX.fullmatch(item) or _REFERENCE.fullmatch(item)):
            raise ValueError(
                f"{item!r} is neither an image reference (vllm/vllm-openai:v0.11.0) nor a prefix (ghcr.io/org/)"
            )
        out.append(item)
    return tuple(out)


def canonical_name(name: str) -> str:
    """A repository name as the runtime pulls it: Docker Hub's short forms completed (busybox ->
    docker.io/library/busybox), as splitDockerDomain in distribution/reference v0.6.0 normalize.go."""
    first, slash, rest = name.partition("/")
    if not slash:
        domain, remote = "docker.io", name
    elif first == "index.docker.io":
        domain, remote = "docker.io", rest
    elif first == "localhost" or "." in first or ":" in first or first.lower() != first:
        domain, remote = first, rest
    else:
        domain, remote = "docker.io", name
    if domain == "docker.io" and "/" not in remote:
        remote = f"library/{remote}"
    return f"{domain}/{remote}"


def canonical_prefix(prefix: str) -> str:
    """A prefix entry (ending in /) in canonical form: a registry (ghcr.io/, docker.io/) or a
    namespace within one (vllm/ is docker.io/vllm/)."""
    head = prefix.rstrip("/")
    if "/" not in head and (head == "localhost" or "." in head or ":" in head):
        return f"{'docker.io' if head == 'index.docker.io' else head}/"
    return canonical_name(f"{head}/x")[: -len("x")]


@dataclass(frozen=True)
class ImageRef:
    """An image reference in canonical form. `pinned`: it names a tag or digest."""

    repository: str
    reference: str
    pinned: bool


def canonical_reference(image: str) -> ImageRef | None:
    """`image` in canonical form; without tag or digest it means :latest (as the kubelet pulls
    it); with a digest the tag is dropped (the digest alone names what is pulled); None when it is
    not a valid image reference."""
    match = _REFERENCE.fullmatch(image)
    if match is None:
        return None
    name, tag, digest = match.groups()
    repository = canonical_name(name)
    if digest is not None:
        return ImageRef(repository, f"{repository}@{digest}", True)
    return ImageRef(repository, f"{repository}:{tag or 'latest'}", tag is not None)


def image_allowed(image: str, allowed: tuple[str, ...]) -> bool:
    """Whether `image` is allowed: an empty list allows any; a prefix entry (ending in /) allows
    every repository under it; a bare repository entry any tag or digest of it; an entry with a
    tag or digest exactly that reference. Both sides compared in canonical form."""
    if not allowed:
        return True
    ref = canonical_reference(image)
    if ref is None:
        return False
    for entry in allowed:
        if entry.endswith("/"):
            if ref.repository.startswith(canonical_prefix(entry)):
                return True
            continue
        want = canonical_reference(entry)
        if want is not None and (ref.reference == want.reference if want.pinned else ref.repository == want.repository):
            return True
    return False


def host_path_problem(path: str, policy: PodPolicy) -> str | None:
    """Why `path` may not back the model cache under `policy`, or None."""
    normal = normal_path(path)
    if normal is None:
        return f"{HOST_PATH_FIELD}: {path!r} is not an absolute path"
    if not policy.host_path_prefixes:
        return (
            f"{HOST_PATH_FIELD}: {path} is a directory on the node and this operator allows none (a node path "
            f"mounted into a pod reaches the node itself); use spec.model.cache.persistentVolumeClaim, or ask the "
            f"cluster's administrator to allow the directory in {PREFIXES_FIX}"
        )
    if not any(under(normal, prefix) for prefix in policy.host_path_prefixes):
        allowed = ", ".join(policy.host_path_prefixes)
        shown = path if normal == path else f"{path} (that is {normal})"
        return (
            f"{HOST_PATH_FIELD}: {shown} is not under a directory this operator allows ({allowed}); use a "
            f"directory under one of them or spec.model.cache.persistentVolumeClaim, or add it to {PREFIXES_FIX}"
        )
    return None


def image_problem(image: str, field: str, policy: PodPolicy) -> str | None:
    """Why `image` (from `field`) may not run under `policy`, or None."""
    if image_allowed(image, policy.allowed_images):
        return None
    allowed = ", ".join(policy.allowed_images)
    return (
        f"{field}: {image} is not an image this operator allows ({allowed}); use one of them, or add it to {IMAGES_FIX}"
    )


def check(host_path: str | None, image: str, image_field: str, policy: PodPolicy) -> str | None:
    """Every problem of the engine pods' node path and image under `policy`, joined; None when
    they are allowed."""
    problems = [
        *([p] if host_path is not None and (p := host_path_problem(host_path, policy)) else []),
        *([p] if (p := image_problem(image, image_field, policy)) else []),
    ]
    return "; ".join(problems) or None
