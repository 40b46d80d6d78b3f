"""What a deployment's engine gets for the settings its creator leaves out, by what it runs on.

The CPU demo's settings (float32, a 256 MiB KV cache, 64 sequences) would waste a GPU: on an
H100 they give a fraction of what vLLM serves by default. So a deployment created on an
accelerator is shaped as vLLM's own server shapes itself there:

- dtype `auto`: the model's own (vLLM runs a float32 checkpoint in bfloat16 where the card has
  it, else float16);
- the KV cache sized from the GPU's memory: vLLM's memory fraction (0.9 unless set), the
  weights, activations and CUDA graphs taken first and the KV cache given the rest;
- CUDA graphs kept on (not `enforce_eager`);
- `max_num_seqs` from the card's memory, as vLLM's server picks it: 1,024 on a card of 70 GiB
  or more (an H100, H200, B200; not an A100, where large batches were measured slower), else
  256.

On a CPU the values stay those the demo and the tests were tuned with: float32 (the CPU build's
fast path), an explicit 256 MiB KV cache (left alone, vLLM on CPU claims most of the machine's
memory) and 64 sequences. docs/deploying.md ("On GPUs") says each in the operator's words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30
CPU_KV_CACHE_BYTES = 256 << 20
GPU_MEMORY_FRACTION = 0.9
LARGE_CARD_BYTES = 70 * GIB


@dataclass(frozen=True)
class Accelerator:
    """The device a deployment's workers run on: a CPU, or a GPU and (where known) its memory."""

    gpu: bool = False
    name: str = ""  # the GPU's name as its driver reports it, or as the operator named it
    memory_bytes: int = 0  # one device's memory; 0: not known


CPU = Accelerator()


@dataclass(frozen=True)
class EngineDefaults:
    dtype: str
    kv_cache_bytes: int  # 0: sized from the GPU's memory by `gpu_memory_utilization`
    gpu_memory_utilization: float
    enforce_eager: bool
    max_num_seqs: int


def engine_defaults(accelerator: Accelerator) -> EngineDefaults:
    """The engine settings of a deployment on `accelerator`, for whatever its creator left out."""
    if not accelerator.gpu:
        return EngineDefaults(
            dtype="float32",
            kv_cache_bytes=CPU_KV_CACHE_BYTES,
            gpu_memory_utilization=GPU_MEMORY_FRACTION,
            enforce_eager=False,
            max_num_seqs=64,
        )
    large = accelerator.memory_bytes >= LARGE_CARD_BYTES and "a100" not in accelerator.name.lower()
    return EngineDefaults(
        dtype="auto",
        kv_cache_bytes=0,
        gpu_memory_utilization=GPU_MEMORY_FRACTION,
        enforce_eager=False,
        max_num_seqs=1024 if large else 256,
    )


def accelerator_detected() -> Accelerator:
    """This machine's first GPU as torch sees it, or the CPU where there is none."""
    import torch

    if not torch.cuda.is_available():
        return CPU
    properties = torch.cuda.get_device_properties(0)
    return Accelerator(
        gpu=True, name=str(properties.name), memory_bytes=int(properties.total_memory)
    )


def accelerator_for(named: str, detected: Accelerator) -> Accelerator:
    """What a deployment runs on: the operator's `--accelerator` where it says `cpu` or names a
    GPU this machine does not have (its memory then unknown), else what this machine has."""
    if named.lower() == "cpu":
        return CPU
    if detected.gpu or not named:
        return detected
    # A GPU type as nvidia-smi names it carries its memory ("NVIDIA-H100-80GB-HBM3").
    memory = re.search(r"(\d+)\s*GB", named, re.IGNORECASE)
    return Accelerator(gpu=True, name=named, memory_bytes=int(memory[1]) * GIB if memory else 0)
