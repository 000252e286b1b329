"""Which engine profile a deployment runs: the engine and its release, from a version or an image.

A profile (kvscale/sizing/catalog/engines.yaml) describes one engine release; the one chosen
for release R is the newest profile of that engine whose `covers_from` is at or below R. No
version known (no tag, `latest`, a digest): the engine's newest profile, as `--engine vllm`.
A release older than every profile gets the oldest. Pure: the operator calls it with
spec.engine.type and spec.engine.image, the CLI with `--engine-command` and `--engine-version`.
"""

from __future__ import annotations

import re

from kvscale.sizing.catalog import Catalog, EngineProfile, GpuSpec, version_key

# A release inside a tag: `v0.11.0`, `0.5.4.post2-cu126`, AMD's `rocm6.4.1_vllm_0.10.1_20250909`
# (the number after the engine's name), TGI's `3.3.7-rocm`.
_AFTER_ENGINE = re.compile(r"(?:vllm|sglang|tgi|trtllm|tensorrt[-_]llm)[-_]v?(\d+(?:\.\d+)+)")
_LEADING = re.compile(r"^v?(\d+(?:\.\d+)+)")


def release_of(image_or_version: str | None) -> str | None:
    """The engine release an image reference or a version string names, or None.

    `vllm/vllm-openai:v0.11.0` -> `0.11.0`; `lmsysorg/sglang:v0.5.4.post2-cu126` -> `0.5.4`;
    `rocm/vllm:rocm6.4.1_vllm_0.10.1_20250909` -> `0.10.1`; `0.9` -> `0.9`; `latest`, a
    digest or no tag -> None. A registry port (`host:5000/repo`) is not a tag.
    """
    if not image_or_version:
        return None
    text = image_or_version.strip().split("@", 1)[0]
    last = text.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else (text if "/" not in text else "")
    if not tag:
        return None
    found = _AFTER_ENGINE.search(tag.lower()) or _LEADING.match(tag.lower())
    return found.group(1) if found else None


def profile_for(catalog: Catalog, engine: str, image_or_version: str | None = None) -> EngineProfile:
    """The catalog profile of `engine` for the release `image_or_version` names (see module doc).

    `engine` may also be a profile key (`vllm-0.2`): that profile, whatever the version.
    """
    if engine in catalog.engines:
        return catalog.engines[engine]
    profiles = catalog.engine_profiles(engine)
    if not profiles:
        return catalog.engine(engine)  # the catalog's error: unknown engine, with the known ones
    release = release_of(image_or_version)
    if release is None:
        return catalog.engine(engine)
    wanted = version_key(release)
    covering = [p for p in profiles if version_key(p.covers_from) <= wanted]
    return covering[-1] if covering else profiles[0]


def profile_on(
    catalog: Catalog, engine: str, gpu: GpuSpec, image: str | None = None, rocm_image: str | None = None
) -> EngineProfile:
    """The profile of the release the engine pods on `gpu` run: the tag of `rocm_image` on AMD
    GPUs and of `image` on the others (spec.engine.rocmImage / image), else the tag of the
    catalog's image for the engine and vendor, the one kvscale.control.resources.engine_image
    deploys then."""
    newest = catalog.engine(engine)
    if gpu.vendor == "amd":
        return profile_for(catalog, engine, rocm_image or newest.rocm_image)
    return profile_for(catalog, engine, image or newest.image)


def describe(profile: EngineProfile) -> str:
    """`vllm-0.11 (vLLM 0.10 and later)`: what a plan says it assumed."""
    return f"{profile.profile} ({profile.name} {profile.covers_from} and later)"
