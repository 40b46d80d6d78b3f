"""The encoder worker normalises each request's vectors as torch's `normalize` would."""

from __future__ import annotations

import numpy as np
import torch

from workers.encoder_worker import unit_length


def test_vectors_come_out_at_unit_length_as_torch_makes_them():
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((6, 384)) * rng.uniform(0.01, 50, (6, 1))).astype("<f4")
    rows[5] = 0.0  # a zero vector stays zero, not NaN
    ours = np.frombuffer(unit_length(rows.tobytes(), dimensions=384), "<f4").reshape(6, 384)
    theirs = torch.nn.functional.normalize(torch.from_numpy(rows), dim=-1).numpy()
    assert np.allclose(ours, theirs, rtol=0, atol=1e-7)
    assert np.allclose(np.linalg.norm(ours[:5], axis=1), 1.0, atol=1e-6)
    assert not ours[5].any()
