"""Catalogs as data: GPUs, models, precisions and engine profiles, each entry with a source."""

from kvscale.sizing.catalog.loader import (
    Catalog,
    CatalogError,
    EngineProfile,
    GpuSpec,
    KvPrecisionSpec,
    LinkSpec,
    ModelArch,
    PrecisionSpec,
    QuantizedSource,
    default_catalog,
    load_catalog,
    load_yaml,
    load_yaml_all,
)

__all__ = [
    "Catalog",
    "CatalogError",
    "EngineProfile",
    "GpuSpec",
    "KvPrecisionSpec",
    "LinkSpec",
    "ModelArch",
    "PrecisionSpec",
    "QuantizedSource",
    "default_catalog",
    "load_catalog",
    "load_yaml",
    "load_yaml_all",
]
