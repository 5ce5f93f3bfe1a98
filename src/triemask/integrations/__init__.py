"""Engine adapters (transformers, vLLM, SGLang) live here; each imports its engine lazily."""
