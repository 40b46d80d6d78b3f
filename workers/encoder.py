"""The encoder engine: a transformer that turns token ids into one normalised vector each.

Torch and transformers are imported when the engine starts, so importing this module is cheap.
It runs the sentence-transformers recipe its version's manifest records: the model's last
hidden states, pooled (mean over real tokens, or the first token), then scaled to unit length.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _auto_dtype(torch: Any) -> str:
    """bfloat16 where the hardware computes it natively (GPUs, CPUs with AMX or AVX512-BF16).

    A small encoder's batches run about twice as fast in it, and its vectors stay within
    ~1e-2 of float32 ones; elsewhere bfloat16 is emulated and slower, so float32.
    """
    if torch.cuda.is_available():
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if " amx_bf16" in flags or " avx512_bf16" in flags else "float32"


@dataclass(frozen=True)
class EncoderSpec:
    model_dir: Path
    dtype: str
    pooling: str  # "mean" or "cls"
    normalize: bool
    dimensions: int
    max_batch_size: int
    latency_slo_seconds: float
    max_length: int


class EncoderEngine:
    """One encoder model in this process; `compute` runs one padded batch (off the loop)."""

    def __init__(self, spec: EncoderSpec) -> None:
        if spec.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {spec.dtype!r}")
        self.spec = spec
        self._model: Any = None
        self._torch: Any = None
        self._pad_id = 0
        self._token_types = False
        self.dtype = spec.dtype

    def start(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoConfig, AutoModel

        self._torch = torch
        if not torch.cuda.is_available():
            torch.set_num_threads(len(os.sched_getaffinity(0)))
        # The version's verified local files (local_files_only): nothing is downloaded.
        config = AutoConfig.from_pretrained(str(self.spec.model_dir), local_files_only=True)  # nosec B615
        self._pad_id = int(getattr(config, "pad_token_id", 0) or 0)
        self._token_types = getattr(config, "type_vocab_size", 0) > 0
        model = AutoModel.from_pretrained(str(self.spec.model_dir), local_files_only=True)  # nosec B615
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtype = _auto_dtype(torch) if self.spec.dtype == "auto" else self.spec.dtype
        self._model = model.to(device=device, dtype=getattr(torch, self.dtype)).eval()

    def compute(self, batch: list[list[int]]) -> list[bytes]:
        """Return each input's pooled vector as float32 little-endian bytes.

        Not normalised here: the worker normalises each request's vectors unless it asks for
        them as pooled (vLLM's `use_activation: false`), and a batch mixes requests.
        """
        torch = self._torch
        device = next(self._model.parameters()).device
        longest = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), longest), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self._token_types else {}
        with torch.inference_mode():
            hidden = self._model(
                input_ids=input_ids, attention_mask=mask, **extra
            ).last_hidden_state.float()
            if self.spec.pooling == "cls":
                vectors = hidden[:, 0]
            else:
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                vectors = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        rows = vectors.to("cpu").numpy().astype("<f4")
        return [row.tobytes() for row in rows]

    async def health(self) -> None:
        if self._model is None:
            raise RuntimeError("the encoder is not loaded")

    def kv_cache_usage(self) -> float | None:
        return None  # an encoder keeps no cache between requests

    def shutdown(self) -> None:
        self._model = None
