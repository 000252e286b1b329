"""The catalog some scenario tests are sized on: `vllm` as engines.yaml's vllm-0.2 (see the overlay)."""

from functools import cache
from pathlib import Path

from kvscale.sizing.catalog import Catalog, load_catalog

VLLM_0_2_AS_VLLM = Path(__file__).with_name("vllm-0.2-as-vllm.yaml")


@cache
def catalog_2023() -> Catalog:
    """The built-in catalog with `vllm` (its newest profile) set to vllm-0.2's fitted fields."""
    return load_catalog(VLLM_0_2_AS_VLLM)
