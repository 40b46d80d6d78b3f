"""The worker's stream interval: the configured one, else its engine's device's default."""

from __future__ import annotations

import pytest

from workers.runner import CPU_STREAM_INTERVAL_MS, stream_interval_ms


@pytest.mark.parametrize(
    ("configured", "on_accelerator", "expected"),
    [
        (None, True, 0.0),  # a GPU host relays every engine step
        (None, False, CPU_STREAM_INTERVAL_MS),  # a CPU engine shares its cores with the relay
        (5.0, True, 5.0),  # a configured interval wins on either device
        (0.0, False, 0.0),  # 0 is a setting, not "unset"
    ],
)
def test_stream_interval(configured: float | None, on_accelerator: bool, expected: float) -> None:
    assert stream_interval_ms(configured, on_accelerator=on_accelerator) == expected


def test_setting_unset_is_none_and_zero_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import config.settings.base as base

    try:
        monkeypatch.delenv("ROUNDHOUSE_STREAM_INTERVAL_MS", raising=False)
        assert importlib.reload(base).ROUNDHOUSE_STREAM_INTERVAL_MS is None
        monkeypatch.setenv("ROUNDHOUSE_STREAM_INTERVAL_MS", "0")
        assert importlib.reload(base).ROUNDHOUSE_STREAM_INTERVAL_MS == 0.0
    finally:
        monkeypatch.undo()
        importlib.reload(base)
