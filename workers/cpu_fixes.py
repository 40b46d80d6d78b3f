"""Fixes to vLLM's CPU build, applied inside its engine-core process.

The worker names `CpuEngineFixes` as vLLM's `worker_extension_cls` on a CPU engine, and vLLM
imports this module in the engine core, where importing it patches vLLM. Two bugs of vLLM 0.32
on CPU:

1. **LoRA.** vLLM's CPU LoRA kernels (`bgmv_*` in torch_ops) mark a token without an adapter
   with index -1 and then index the stacked adapter weights with it, which in PyTorch is the
   *last* adapter slot: a base-model request batched with adapter requests silently gets an
   adapter's output (upstream vllm-project/vllm#48421, #49656). The GPU (Triton) kernels skip
   such tokens; the three ops are patched to do the same.
2. **A seeded request's chunked prefill.** When a step computes only part of a prompt (chunked
   prefill: the step's token budget is shared), vLLM still samples for it, discards the token
   and undoes the random draw by moving the request's generator back (`set_offset`). Only
   CUDA's generators have an offset: on CPU the call raised, and the engine died with every
   request in it. Four requests with a seed and 1,400-token prompts at once were enough, so
   one tenant could stop every tenant's requests on a CPU worker, again and again. Here the
   generator's state is kept before the draw and put back instead: a seeded request samples
   the same tokens whether its prompt was chunked or not, as on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

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


_REWINDS = "__roundhouse_rewinds_cpu_generators__"


class _Rewind:
    """Stands in for a CPU generator where vLLM moves it back by an offset: puts back the state
    it had before the step's draw."""

    def __init__(self, generator: torch.Generator, state: torch.Tensor) -> None:
        self.generator = generator
        self.state = state

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        self.generator.set_state(self.state)


def _discarded(runner: Any) -> dict[int, torch.Generator]:
    """The CPU generators of this step's requests whose sampled token vLLM will discard."""
    batch = runner.input_batch
    if not batch.generators:
        return {}  # no seeded request in the batch: nothing to keep (most steps)
    rows = np.nonzero(runner.discard_request_mask.np[: batch.num_reqs])[0]
    found = {}
    for row in rows:
        generator = batch.generators.get(int(row))
        if generator is not None and generator.device.type == "cpu":
            found[int(row)] = generator
    return found


def _keep_states(sample: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(sample)
    def patched(self: Any, *args: Any, **kw: Any) -> Any:
        self._roundhouse_kept = {row: g.get_state() for row, g in _discarded(self).items()}
        return sample(self, *args, **kw)

    return patched


def _rewind_kept(bookkeeping: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(bookkeeping)
    def patched(self: Any, *args: Any, **kw: Any) -> Any:
        kept: dict[int, torch.Tensor] = getattr(self, "_roundhouse_kept", {})
        self._roundhouse_kept = {}
        generators = self.input_batch.generators
        swapped = {row: generators[row] for row in kept if row in generators}
        for row, generator in swapped.items():
            generators[row] = _Rewind(generator, kept[row])
        try:
            return bookkeeping(self, *args, **kw)
        finally:
            generators.update(swapped)

    setattr(patched, _REWINDS, True)
    return patched


# Only where the runner has both steps (vLLM 0.32's; the e2e test checks the pinned release),
# and once however often the module is imported.
_sample_step = getattr(GPUModelRunner, "_sample", None)
_bookkeeping_step = getattr(GPUModelRunner, "_bookkeeping_sync", None)
if (
    _sample_step is not None
    and _bookkeeping_step is not None
    and not getattr(_bookkeeping_step, _REWINDS, False)
):
    GPUModelRunner._sample = _keep_states(_sample_step)  # type: ignore[method-assign]
    GPUModelRunner._bookkeeping_sync = _rewind_kept(_bookkeeping_step)  # type: ignore[method-assign]


class CpuEngineFixes:
    """An empty worker extension: importing this module in the engine core is the point."""
