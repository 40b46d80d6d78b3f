"""vLLM's own OpenAI server beside the platform, on the same model with the same engine settings.

The platform side is the session's `stack` (frontend, worker, ingester) and `world`; this file
adds `vllm_server`, started from the deployment the platform's worker serves, so a setting
changed there changes here too. vLLM's servers (and the reasoning model's worker) live as long
as this package's tests: idle engines left running would take the cores the rest of the
session's tests need.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from models_registry.models import Deployment
from tests.conftest import (
    ALIAS,
    ROOT,
    Process,
    Stack,
    World,
    _free_port,
    _http_ok,
    _spawn,
    _wait_for,
)

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


def vllm_arguments(
    deployment: Deployment, model_dir: Path, port: int, *, served_name: str = ALIAS
) -> list[str]:
    """vLLM's server arguments for the engine the platform's worker builds for a deployment.

    workers.services.worker_plan turns a deployment into an EngineSpec, and workers.engine
    that into AsyncEngineArgs: these are the same settings, plus what the server needs to
    answer what the platform answers (cached tokens, tool calls with the hermes parser, a
    reasoning model's thinking with its version's reasoning parser).
    """
    version = deployment.version
    extra = version.engine_args
    args = [
        "--model", str(model_dir),
        "--served-model-name", served_name,
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
    if version.reasoning_parser:
        args += ["--reasoning-parser", version.reasoning_parser]
    if extra.pop("enforce_eager", deployment.enforce_eager):
        args.append("--enforce-eager")
    prefix = extra.pop("enable_prefix_caching", deployment.prefix_caching)
    args.append("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching")
    if extra:
        pytest.fail(f"the version's engine arguments {sorted(extra)} have no server flag here")
    return args


@contextlib.contextmanager
def _vllm_started(
    arguments: list[str],
    port: int,
    logs: Path,
    name: str,
    *,
    module: str = "vllm.entrypoints.openai.api_server",
) -> Iterator[tuple[Process, int]]:
    """vLLM's OpenAI server started with these arguments (not waited for); stopped at the end.

    `module` may name vLLM's rendering server instead (no engine: it writes and tokenises
    prompts only)."""
    log = logs / f"{name}.log"
    popen = subprocess.Popen(
        [sys.executable, "-m", module, *arguments],
        cwd=ROOT,
        env={**os.environ, **ENGINE_ENV},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield Process(name=name, popen=popen, log=log), port
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


@pytest.fixture(scope="package")
def vllm_process(
    world: World, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Process, int]]:
    """Start vLLM's OpenAI server on the demo model (not waiting); stop it when the session ends."""
    port = _free_port()
    arguments = vllm_arguments(world.deployment, demo_model_dir, port)
    with _vllm_started(arguments, port, tmp_path_factory.mktemp("vllm-server"), "vllm-server") as p:
        yield p


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
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


# A reasoning model: the demo model registered again with vLLM's qwen3 reasoning parser (which
# reads <think> and </think> as text), on a deployment and a worker of its own, beside vLLM's
# server started with the same parser. Only the cases that need one start them.
THINKING = "tiny-thinking"


@pytest.fixture(scope="session")
def thinking_deployment(world: World, demo_model_dir: Path, django_db_blocker: Any) -> Deployment:
    with django_db_blocker.unblock():
        return _registered_beside(world, THINKING, demo_model_dir, reasoning_parser="qwen3")


def _registered_beside(
    world: World, name: str, source_dir: Path, *, reasoning_parser: str = ""
) -> Deployment:
    """The model in `source_dir` registered as `name` (hermes tools), with an alias and a
    deployment of that name sized as the demo's."""
    from models_registry.services import alias_set, deployment_create, model_version_register

    version, _ = model_version_register(
        model_name=name,
        source_dir=source_dir,
        price_input_per_1k=Decimal("0.5"),
        price_output_per_1k=Decimal("1.5"),
        tool_parser="hermes",
        reasoning_parser=reasoning_parser,
    )
    alias_set(name=name, version=version)
    return deployment_create(
        name=name,
        version=version,
        max_num_seqs=8,
        max_model_len=world.deployment.context_length,
        kv_cache_bytes=world.deployment.kv_cache_bytes,
        enforce_eager=True,
    )


@pytest.fixture(scope="package")
def thinking_targets(
    stack: Stack,
    world: World,
    thinking_deployment: Deployment,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Targets]:
    """The reasoning model through the platform (its own worker) and on vLLM's own server
    with the same reasoning parser; the two engines load side by side."""
    logs = tmp_path_factory.mktemp("thinking")
    port = _free_port()
    arguments = vllm_arguments(thinking_deployment, demo_model_dir, port, served_name=THINKING)
    worker = _spawn(
        "thinking-worker",
        ["manage.py", "run_worker", "--deployment", THINKING, "--metrics-port", str(_free_port())],
        logs,
    )
    try:
        with _vllm_started(arguments, port, logs, "vllm-thinking") as (server, _):
            base_url = f"http://127.0.0.1:{port}"
            _wait_for(server, lambda: _http_ok(f"{base_url}/health"), timeout=600)
            _wait_for(worker, lambda: "ready: serving" in worker.tail(400), timeout=600)
            headers = {"Authorization": f"Bearer {world.acme_key}"}
            with (
                httpx.Client(base_url=stack.base_url, headers=headers, timeout=120) as platform,
                httpx.Client(base_url=base_url, timeout=120) as vllm,
            ):
                yield Targets(platform=platform, vllm=vllm)
    finally:
        worker.popen.send_signal(signal.SIGTERM)
        try:
            worker.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.popen.kill()


# A model whose chat template loops over each message's content (as Llama 4's and Gemma 3's do,
# and many multimodal models'): vLLM's server gives such a template content as a list of parts
# (a text part's other fields too, which this one shows for `cache_control`).
# It is the demo model with this template, registered beside it with an alias and a deployment
# (no worker: only its tokenizer is used), against vLLM's rendering server on the same files.
PARTS = "tiny-parts"
PARTS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for tool in tools %}"
    "{{- (tool | tojson) + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] | trim }}"
    "{%- if part['cache_control'] is defined %}{{- '<cached>' }}{%- endif %}"
    "{%- elif part['type'] == 'tool_reference' %}{{- '<tool>' + part['name'] + '</tool>' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{{- '<tool_call>' + (call['function'] | tojson) + '</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="session")
def parts_model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model's files with PARTS_TEMPLATE as its chat template."""
    directory = tmp_path_factory.mktemp("models") / PARTS
    shutil.copytree(demo_model_dir, directory)
    (directory / "chat_template.jinja").write_text(PARTS_TEMPLATE)
    return directory


@pytest.fixture(scope="package")
def parts_targets(
    stack: Stack,
    world: World,
    parts_model_dir: Path,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Targets]:
    """The parts model through the platform and on vLLM's rendering server."""
    with django_db_blocker.unblock():
        _registered_beside(world, PARTS, parts_model_dir)
    port = _free_port()
    arguments = [
        "--model", str(parts_model_dir),
        "--served-model-name", PARTS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(world.deployment.context_length),
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    logs = tmp_path_factory.mktemp("parts")
    module = "vllm.entrypoints.launchers.render.entry"
    with _vllm_started(arguments, port, logs, "vllm-render", module=module) as (server, _):
        base_url = f"http://127.0.0.1:{port}"
        _wait_for(server, lambda: _http_ok(f"{base_url}/health"), timeout=600)
        headers = {"Authorization": f"Bearer {world.acme_key}"}
        with (
            httpx.Client(base_url=stack.base_url, headers=headers, timeout=120) as platform,
            httpx.Client(base_url=base_url, timeout=120) as vllm,
        ):
            yield Targets(platform=platform, vllm=vllm)
