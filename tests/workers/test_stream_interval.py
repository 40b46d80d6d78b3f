"""The worker's stream interval: the configured one, else its engine's device's default."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.runner import CPU_STREAM_INTERVAL_MS, FLOW_STREAMS, Worker, stream_interval_ms


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


@pytest.mark.parametrize(
    ("streams", "flow", "expected"),
    [
        (1, FLOW_STREAMS, 0.0),  # few streams: every step's tokens go at once
        (FLOW_STREAMS, FLOW_STREAMS, 0.0),
        (16, 8, 0.04),  # past them the interval, stretched with the batch
        (64, 8, 0.08),  # at most four times
        (4, 0, 0.02),  # flowing turned off: the interval at any load, as before
        (32, 0, 0.08),
    ],
)
def test_tokens_flow_until_the_batch_outgrows_the_relay(
    streams: int, flow: int, expected: float
) -> None:
    worker = SimpleNamespace(
        active=dict.fromkeys(range(streams)), stream_interval=0.02, flow_streams=flow
    )
    assert Worker._interval(worker) == pytest.approx(expected)  # type: ignore[arg-type]


def test_an_interval_of_zero_flows_at_any_load() -> None:
    worker = SimpleNamespace(active=dict.fromkeys(range(64)), stream_interval=0.0, flow_streams=0)
    assert Worker._interval(worker) == 0.0  # type: ignore[arg-type]
