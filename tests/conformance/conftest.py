"""vLLM's own OpenAI server beside the platform, on the same model with the same engine settings.

The platform side is the session's `stack` (frontend, worker, ingester) and `world`; this file
adds `vllm_server`, started from the deployment the platform's worker serves, so a setting
changed there changes here too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from models_registry.demo_model import whitespace_token_ids
from tests.conftest import ALIAS, ROOT, Process, Stack, World, _free_port, _http_ok, _wait_for

# The worker's engine environment (workers.engine._engine_environment) and nothing else.
ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class VllmServer:
    base_url: str
    process: Process


def vllm_arguments(world: World, model_dir: Path, port: int) -> list[str]:
    """vLLM's server arguments for the engine the platform's worker builds for its deployment.

    workers.services.worker_plan turns a deployment into an EngineSpec, and workers.engine
    that into AsyncEngineArgs: these are the same settings, plus what the server needs to
    answer what the platform answers (cached tokens, tool calls with the hermes parser).
    """
    deployment = world.deployment
    extra = world.version.engine_args
    args = [
        "--model", str(model_dir),
        "--served-model-name", ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", str(extra.pop("dtype", deployment.dtype)),
        "--max-model-len", str(deployment.context_length),
        "--max-num-seqs", str(extra.pop("max_num_seqs", deployment.max_num_seqs)),
        "--kv-cache-memory-bytes", str(deployment.kv_cache_bytes),
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    if extra.pop("enforce_eager", deployment.enforce_eager):
        args.append("--enforce-eager")
    prefix = extra.pop("enable_prefix_caching", deployment.prefix_caching)
    args.append("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching")
    if extra:
        pytest.fail(f"the version's engine arguments {sorted(extra)} have no server flag here")
    return args


@pytest.fixture(scope="session")
def vllm_process(
    world: World, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Process, int]]:
    """Start vLLM's OpenAI server on the demo model (not waiting); stop it when the session ends."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "vllm-server.log"
    popen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *vllm_arguments(world, demo_model_dir, port),
        ],
        cwd=ROOT,
        env={**os.environ, **ENGINE_ENV},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield Process(name="vllm-server", popen=popen, log=log), port
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


@pytest.fixture(scope="session")
def vllm_server(vllm_process: tuple[Process, int]) -> VllmServer:
    """vLLM's own server, once its /health answers."""
    process, port = vllm_process
    base_url = f"http://127.0.0.1:{port}"
    _wait_for(process, lambda: _http_ok(f"{base_url}/health"), timeout=600)
    return VllmServer(base_url=base_url, process=process)


@dataclass(frozen=True)
class Targets:
    """One client per server; the platform's sends the tenant acme's key."""

    platform: httpx.Client
    vllm: httpx.Client


@pytest.fixture(scope="session")
def targets(
    vllm_process: object, stack: Stack, vllm_server: VllmServer, world: World
) -> Iterator[Targets]:
    """Both servers; vLLM's starts first, so the two engines load side by side."""
    base_url = stack.base_url
    headers = {"Authorization": f"Bearer {world.acme_key}"}
    with (
        httpx.Client(base_url=base_url, headers=headers, timeout=120) as platform,
        httpx.Client(base_url=vllm_server.base_url, timeout=120) as vllm,
    ):
        yield Targets(platform=platform, vllm=vllm)


@pytest.fixture(scope="session")
def whitespace_ids(demo_model_dir: Path) -> list[int]:
    """The demo tokenizer's tokens that are only whitespace (not its special tokens)."""
    return whitespace_token_ids(demo_model_dir)
