"""Enum sets of the benchmark (paper, appendix C.2), by name.

``tools`` (synthetic tool names, any K), ``products`` (synthetic product names,
K = 1,500), ``icd10cm`` (74,719 ICD-10-CM FY2026 codes), and the four
classification label sets ``trec``, ``massive``, ``banking77``, ``clinc150``.
"""

from __future__ import annotations

from triemask.datasets import LABEL_SETS, load_icd10cm, load_labels, synthetic_products, synthetic_tools

SETS = ("tools", "products", "icd10cm", *LABEL_SETS, "ids", "words", "npm-names")


def load(name: str, k: int | None = None) -> list[str]:
    """The set ``name``; ``k`` sizes the synthetic sets (tools, products, ids) and takes the
    first ``k`` of the large real ones (words, npm-names; 0 or None: all of it)."""
    if name in ("words", "npm-names"):
        from .large_sets import load_large

        values = load_large(name)
        return values[:k] if k else values
    if name == "ids":
        from .large_sets import synthetic_ids

        return synthetic_ids(k if k else 500_000, seed=0)
    if name == "tools":
        return synthetic_tools(k if k is not None else 1_000, seed=0)
    if name == "products":
        return synthetic_products(k if k is not None else 1_500, seed=0)
    if name == "icd10cm":
        return load_icd10cm()
    if name in LABEL_SETS:
        return load_labels(name)
    raise ValueError(f"unknown set {name!r}; choose from {', '.join(SETS)}")
