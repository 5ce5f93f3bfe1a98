"""Checked by mypy (`make typecheck`), never run: the helpers triemask imports on first use
(they need torch and transformers) have their real types, not `object`."""

from collections.abc import Callable

import triemask

choose: Callable[..., object] = triemask.choose
generate_json: Callable[..., object] = triemask.generate_json
load_default_model: Callable[..., object] = triemask.load_default_model
