"""Build a tiny, deterministic LoRA adapter (PEFT format) for the demo model, from a seed."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"

# vLLM 0.32 accepts q/k/v/o_proj, gate/up/down_proj, embed_tokens and lm_head for Llama
# (it packs q/k/v and gate/up itself); the classic attention pair is enough for a demo.
TARGET_MODULES = ("q_proj", "v_proj")
# Trained adapters start with lora_B = 0; a demo adapter needs a visible effect instead.
# With this std the weight delta (alpha/r) * B @ A has std ~0.05 against the base weights'
# 0.02: greedy output of the random demo model changes within the first few tokens.
LORA_B_STD = 0.1


def demo_adapter_build(*, base_dir: Path, out_dir: Path, rank: int = 8, seed: int = 1) -> Path:
    """Build a LoRA adapter for the model in base_dir into out_dir atomically; return out_dir.

    The same base config, rank and seed give byte-identical files, so the adapter
    content-addresses to the same version wherever it is built.
    """
    if rank <= 0:
        msg = f"rank must be positive, got {rank}"
        raise ValueError(msg)
    base_dir = Path(base_dir).resolve()
    base_config = json.loads((base_dir / "config.json").read_text())
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        msg = f"{out_dir} already exists"
        raise FileExistsError(msg)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write_adapter_config(tmp_dir, base_name=base_dir.name, rank=rank)
        _write_adapter_weights(tmp_dir, base_config=base_config, rank=rank, seed=seed)
        _make_readable(tmp_dir)
        tmp_dir.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _make_readable(target: Path) -> None:
    """Give target and its files ordinary read permissions."""
    # mkdtemp and the safetensors writer create owner-only (0700/0600) entries.
    target.chmod(0o755)
    for path in target.iterdir():
        path.chmod(0o644)


def _write_adapter_config(target: Path, *, base_name: str, rank: int) -> None:
    """Write a PEFT LoRA adapter_config.json into target."""
    # The base is named by directory name, not absolute path, so the file (and the
    # version digest) does not depend on where the base model happens to live.
    config: dict[str, Any] = {
        "base_model_name_or_path": base_name,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": list(TARGET_MODULES),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    (target / ADAPTER_CONFIG_FILE).write_text(text)


def _write_adapter_weights(
    target: Path, *, base_config: dict[str, Any], rank: int, seed: int
) -> None:
    """Write seeded lora_A/lora_B tensors for every target module into target."""
    import torch
    from safetensors.torch import save_file

    shapes = _projection_shapes(base_config)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(base_config["num_hidden_layers"]):
        for module in TARGET_MODULES:
            in_features, out_features = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = _randn(
                (rank, in_features), std=1 / math.sqrt(in_features), generator=generator
            )
            tensors[f"{prefix}.lora_B.weight"] = _randn(
                (out_features, rank), std=LORA_B_STD, generator=generator
            )
    save_file(tensors, str(target / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})


def _randn(shape: tuple[int, int], *, std: float, generator: torch.Generator) -> torch.Tensor:
    """Return a float32 normal tensor with the given std, drawn from generator."""
    import torch

    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def _projection_shapes(base_config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Map each attention projection to its (in_features, out_features) in the base model."""
    hidden = base_config["hidden_size"]
    heads = base_config["num_attention_heads"]
    kv_heads = base_config.get("num_key_value_heads") or heads
    head_dim = base_config.get("head_dim") or hidden // heads
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
