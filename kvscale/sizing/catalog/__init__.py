"""Catalogs as data: GPUs, models, precisions and engine profiles, each entry with a source."""

from kvscale.sizing.catalog.loader import (
    PERFORMANCE_FIELDS,
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
    version_key,
)

__all__ = [
    "PERFORMANCE_FIELDS",
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
    "version_key",
]
