"""Make vLLM's CPU LoRA ops leave requests without an adapter alone.

vLLM 0.32's CPU LoRA kernels (`bgmv_*` in torch_ops) mark a token without an adapter with
index -1 and then index the stacked adapter weights with it, which in PyTorch is the *last*
adapter slot: a base-model request batched with adapter requests silently gets an adapter's
output (upstream vllm-project/vllm#48421, #49656). The GPU (Triton) kernels skip such tokens.

This module patches the three ops to do the same. It must run inside the engine-core
process, so the worker names `LoRANoAdapterFix` as vLLM's `worker_extension_cls`, whose
module vLLM imports there. Only CPU engines use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu

_PATCHED = "__roundhouse_skips_no_lora__"


def _skip_no_lora(op: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(op)
    def patched(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kw: Any) -> Any:
        skip = indices < 0
        if not bool(skip.any()):
            return op(inputs, weights, output, indices, *args, **kw)
        rows = output[: skip.shape[0]]
        kept = rows[skip].clone()
        op(inputs, weights, output, indices.clamp(min=0), *args, **kw)
        rows[skip] = kept  # rows without an adapter stay as the base model computed them
        return None

    setattr(patched, _PATCHED, True)
    return patched


for _name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
    _op = getattr(lora_ops, _name)
    if not getattr(_op, _PATCHED, False):
        _fixed = _skip_no_lora(_op)
        setattr(lora_ops, _name, _fixed)  # the sgmv_* ops look these up in lora_ops
        setattr(punica_cpu, _name, _fixed)  # the decode path imported them by name


class LoRANoAdapterFix:
    """An empty worker extension: importing this module in the engine core is the point."""
