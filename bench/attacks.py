"""Attacks, one at a time: what one tenant's abuse costs another tenant's requests.

Tenant V (the victim) sends a short chat, then lists its files (a small read from
PostgreSQL), one after another: first alone, then under each attack below, run by tenant A from
a process of its own. Each attack is one of the second hardening round's findings:

- truncation: Responses requests of 1,200 one-letter turns with `truncation: "auto"`;
- downloads: 16 sockets that ask for a 48 MB file's content and never read it, and 8 clients
  downloading it whole in a loop;
- embeddings: 24 sockets that ask for 2,048 embeddings each and never read the answer;
- ws_frames: one WebSocket sending 1.3 MB `cancel` frames as fast as it can;
- reads: 16 clients reading a stored response (`GET /v1/responses/{id}`) in a loop;
- storage: 4 clients creating conversations of 20 items of 100 KB in a loop;
- batches: ten batches of a 50,000-line file whose lines all fail validation. Here V's measure
  is its own one-line batch: created, run and completed, alone and under A's ten.

We report V's p50 and p99 under each attack ÷ alone (target ≤ 1.5), and the frontend's
resident memory growth during the attack. The engine runs on core 0; the frontend, the
ingester, the encoder worker, Celery and both tenants' clients on core 1.

    .venv/bin/python bench/attacks.py [--requests 60] [--only truncation,reads]

Writes its section of docs/benchmarks.md, docs/img/attacks.png and the raw results to
docs/bench-data/attacks.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import io
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Sent,
    percentile,
    platform_stop,
    plot_path,
    prepare_roundhouse,
    progress,
    results_write,
    roundhouse_stack,
    section_write,
    spawn,
    stop,
    ttft_stages,
    wait_for,
)

TARGET = 1.5
# A new tenant's quota (ROUNDHOUSE_DEFAULT_QUOTA): what a tenant gets unless told otherwise.
DEFAULT_QUOTA: dict[str, Any] = {
    "requests_per_minute": 600,
    "tokens_per_minute": 200_000,
    "max_concurrency": 64,
    "max_tokens_per_request": 1024,
    "monthly_budget": Decimal("100"),
}
ENCODER = "minilm"
WARMUP_SECONDS = 3.0  # an attack is under way this long before V measures
Attack = Callable[
    [dict[str, Any], asyncio.Event, collections.Counter[str]], Coroutine[Any, Any, None]
]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _timed(
    session: aiohttp.ClientSession, method: str, url: str, sent: list[Sent] | None = None, **kw: Any
) -> float:
    """Seconds one request took, read whole; with `sent`, what finds its usage record."""
    at, started = time.time(), time.perf_counter()
    async with session.request(method, url, **kw) as response:
        await response.read()
        rid = response.headers.get("x-request-id")
    took = time.perf_counter() - started
    if sent is not None and rid:
        sent.append(Sent(request_id=rid, sent_at=at, ttft_ms=took * 1000))
    return took


Measured = tuple[list[float], list[float], list[Sent]]


async def _victim(base_url: str, model: str, key: str, n: int) -> Measured:
    """V's chat and file-list latencies, one request after another, and its chats' ids."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    chats: list[float] = []
    reads: list[float] = []
    sent: list[Sent] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(headers=_auth(key), timeout=timeout) as session:
        for _ in range(n):
            chat = f"{base_url}/v1/chat/completions"
            chats.append(await _timed(session, "POST", chat, sent, json=body))
            reads.append(await _timed(session, "GET", f"{base_url}/v1/files?limit=10"))
    return chats, reads, sent


def _stages(sent: list[Sent]) -> dict[str, float]:
    """The median of each stage of V's chats: frontend, queue, engine (to the first token),
    and the rest (the other tokens and the answer's way back)."""
    split = ttft_stages(sent)
    return {
        ("rest" if name == "relay" else name): percentile(values, 0.5)
        for name, values in split.items()
        if values
    }


async def _answered(response: aiohttp.ClientResponse, codes: collections.Counter[str]) -> None:
    text = await response.read()
    code = "ok"
    if response.status >= 400:
        try:
            code = json.loads(text).get("error", {}).get("code", "?")
        except ValueError:
            code = "?"
    codes[f"{response.status} {code}"] += 1


async def _loop(
    clients: int, stop: asyncio.Event, one: Callable[[aiohttp.ClientSession], Awaitable[None]]
) -> None:
    """Run `one` in a loop on `clients` concurrent clients until `stop`."""

    async def client() -> None:
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                try:
                    await one(session)
                except (TimeoutError, aiohttp.ClientError):
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(client() for _ in range(clients)))


async def _truncation(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(1200)]
    body = {
        "model": ctx["model"],
        "input": turns,
        "truncation": "auto",
        "max_output_tokens": 1,
        "store": False,
    }

    async def one(session: aiohttp.ClientSession) -> None:
        url = f"{ctx['url']}/v1/responses"
        async with session.post(url, data=payload, headers=headers) as response:
            await _answered(response, codes)

    payload = json.dumps(body).encode()  # once: the client's own work stays small
    headers = {**_auth(ctx["key"]), "Content-Type": "application/json"}
    await _loop(4, stop, one)


def _raw_requests(
    url: str, path: str, key: str, count: int, *, body: bytes = b"", codes: Any
) -> list[socket.socket]:
    """Open `count` sockets that each send a request and then never read a byte."""
    parts = urlsplit(url)
    method = "POST" if body else "GET"
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
        "Connection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sockets = []
    for _ in range(count):
        s = socket.create_connection((parts.hostname, parts.port))
        if codes is not None:  # left unread: its buffer as small as a stalled client's
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            codes["socket left unread"] += 1
        s.sendall(head + body)
        sockets.append(s)
    return sockets


async def _downloads(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    path = f"/v1/files/{ctx['file_id']}/content"
    held = _raw_requests(ctx["url"], path, ctx["key"], 16, codes=codes)
    done = threading.Event()

    def download() -> None:
        # Read and drop, as a client on another machine would: the bytes are not looked at.
        buffer = bytearray(1 << 20)
        while not done.is_set():
            (sock,) = _raw_requests(ctx["url"], path, ctx["key"], 1, codes=None)
            with sock:
                while sock.recv_into(buffer):
                    pass
            codes["download"] += 1

    readers = [threading.Thread(target=download, daemon=True) for _ in range(8)]
    for reader in readers:
        reader.start()
    try:
        await stop.wait()
    finally:
        done.set()
        for s in held:
            s.close()


async def _embeddings(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    words = [f"sentence number {i} about the weather" for i in range(2048)]
    body = json.dumps({"model": ENCODER, "input": words}).encode()
    held = _raw_requests(ctx["url"], "/v1/embeddings", ctx["key"], 24, body=body, codes=codes)
    try:
        # Ready once every answer has begun: the encoder is done, and the frontend holds what
        # the sockets do not read (the victim then measures the slow readers, not the encoder).
        for sock in held:
            sock.settimeout(600)
            await asyncio.to_thread(sock.recv, 1)
        ctx["ready"].set()
        await stop.wait()
    finally:
        for s in held:
            s.close()


async def _ws_frames(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    import websockets

    frame = json.dumps({"type": "cancel", "id": "x", "pad": "p" * (1300 * 1024)})
    url = ctx["url"].replace("http://", "ws://") + "/v1/ws"
    while not stop.is_set():
        try:
            async with websockets.connect(
                url, additional_headers=_auth(ctx["key"]), max_size=None
            ) as ws:
                drain = asyncio.create_task(_drain(ws, codes))
                try:
                    while not stop.is_set():
                        await ws.send(frame)
                        codes["frame sent"] += 1
                finally:
                    drain.cancel()
        except Exception as exc:
            codes[f"socket closed: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.1)


async def _drain(ws: Any, codes: Any) -> None:
    async for message in ws:
        found = json.loads(message)
        codes[f"frame {found.get('type')} {found.get('code') or ''}".strip()] += 1


async def _reads(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    url = f"{ctx['url']}/v1/responses/{ctx['response_id']}"

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.get(url, headers=_auth(ctx["key"])) as response:
            await _answered(response, codes)

    await _loop(16, stop, one)


async def _storage(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    item = {"type": "message", "role": "user", "content": "x" * 100_000}
    body = {"items": [item] * 20}

    async def one(session: aiohttp.ClientSession) -> None:
        url = f"{ctx['url']}/v1/conversations"
        async with session.post(url, data=payload, headers=headers) as response:
            await _answered(response, codes)

    payload = json.dumps(body).encode()  # once: the client's own work stays small
    headers = {**_auth(ctx["key"]), "Content-Type": "application/json"}
    await _loop(4, stop, one)


async def _batches(ctx: dict[str, Any], stop: asyncio.Event, codes: Any) -> None:
    async with aiohttp.ClientSession(headers=_auth(ctx["key"])) as session:
        for _ in range(10):
            body = {
                "input_file_id": ctx["bad_file_id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            async with session.post(f"{ctx['url']}/v1/batches", json=body) as response:
                await _answered(response, codes)
        await stop.wait()


ATTACKS: dict[str, Attack] = {
    "truncation": _truncation,
    "downloads": _downloads,
    "embeddings": _embeddings,
    "ws_frames": _ws_frames,
    "reads": _reads,
    "storage": _storage,
    "batches": _batches,
}
DESCRIBED = {
    "truncation": "Responses of 1,200 one-letter turns, truncation auto (4 clients)",
    "downloads": "16 unread 48 MB downloads, 8 clients downloading in a loop",
    "embeddings": "24 unread answers of 2,048 embeddings",
    "ws_frames": "1.3 MB cancel frames on one WebSocket",
    "reads": "16 clients reading a stored response",
    "storage": "4 clients creating conversations of 2 MB",
    "batches": "ten batches of 50,000 invalid lines",
}


# Attacks that say themselves when they are under way (the others are at once).
SAYS_READY = frozenset({"embeddings"})


async def _attack(name: str, ctx: dict[str, Any], stop: Any) -> dict[str, int]:
    done = asyncio.Event()
    codes: collections.Counter[str] = collections.Counter()
    if name not in SAYS_READY:
        ctx["ready"].set()
    task = asyncio.create_task(ATTACKS[name](ctx, done, codes))
    while not stop.is_set() and not task.done():
        await asyncio.sleep(0.1)
    done.set()
    try:
        await asyncio.wait_for(task, timeout=60)
    except Exception as exc:
        codes[f"attack ended: {type(exc).__name__}"] += 1
    return dict(codes)


def _attack_process(name: str, ctx: dict[str, Any], stop: Any, out: Any) -> None:
    out.put(asyncio.run(_attack(name, ctx, stop)))


def _under(
    name: str, ctx: dict[str, Any], measure: Callable[[], Any], frontend: psutil.Process
) -> tuple[Any, dict[str, int], float]:
    """V's measure under one attack; A's answers; the frontend's memory growth (MB)."""
    spawner = multiprocessing.get_context("spawn")
    stop_attack, out, ready = spawner.Event(), spawner.Queue(), spawner.Event()
    attacker = spawner.Process(
        target=_attack_process, args=(name, {**ctx, "ready": ready}, stop_attack, out)
    )
    before = frontend.memory_info().rss
    peak = before
    attacker.start()
    try:
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            if deadline is None and ready.wait(0.2):
                deadline = time.monotonic() + WARMUP_SECONDS
            peak = max(peak, frontend.memory_info().rss)
            time.sleep(0.2)
        measured = measure()
        peak = max(peak, frontend.memory_info().rss)
    finally:
        stop_attack.set()
    codes = out.get(timeout=180)
    attacker.join(timeout=60)
    time.sleep(2.0)  # what the attack left behind drains before the next one
    return measured, codes, (peak - before) / 1e6


def _jsonl(lines: int, width: int, *, valid: bool) -> bytes:
    out = io.BytesIO()
    for i in range(lines):
        if valid:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "x" * width}]}
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            out.write(json.dumps({**line, "body": body}).encode() + b"\n")
        else:
            line = {"custom_id": f"r{i}", "method": "GET", "url": "/nowhere"}
            out.write(json.dumps(line).encode() + b"\n")
    return out.getvalue()


async def _upload(base_url: str, key: str, content: bytes, name: str) -> str:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", content, filename=name, content_type="application/jsonl")
    timeout = aiohttp.ClientTimeout(total=600)
    async with (
        aiohttp.ClientSession(headers=_auth(key), timeout=timeout) as session,
        session.post(f"{base_url}/v1/files", data=form) as response,
    ):
        found = await response.json()
        assert response.status == 200, found
        return str(found["id"])


async def _stored_response(base_url: str, model: str, key: str) -> str:
    body = {"model": model, "input": "hi", "max_output_tokens": 2}
    async with (
        aiohttp.ClientSession(headers=_auth(key)) as session,
        session.post(f"{base_url}/v1/responses", json=body) as response,
    ):
        found = await response.json()
        assert response.status == 200, found
        return str(found["id"])


async def _victim_batch(base_url: str, model: str, key: str, file_id: str) -> float:
    """Seconds from creating V's one-line batch to its completion."""
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    async with aiohttp.ClientSession(headers=_auth(key)) as session:
        started = time.perf_counter()
        async with session.post(f"{base_url}/v1/batches", json=body) as response:
            batch = await response.json()
        while batch.get("status") not in ("completed", "failed", "expired", "cancelled"):
            await asyncio.sleep(0.25)
            async with session.get(f"{base_url}/v1/batches/{batch['id']}") as response:
                batch = await response.json()
        return time.perf_counter() - started


def _side_processes(platform: Any, work: Path) -> list[Any]:
    """The encoder worker and the two Celery workers, as the demo runs them, on core 1."""
    py = sys.executable
    logs = {name: work / f"{name}.log" for name in ("encoder", "control", "batches")}
    celery = ["taskset", "-c", "1", py, "-m", "celery", "-A", "config", "worker", "-l", "INFO"]
    commands = {
        "encoder": ["taskset", "-c", "1", py, "manage.py", "run_worker", "--deployment", ENCODER],
        "control": [*celery, "-Q", "control", "-n", "control@%h", "--concurrency", "1", "--beat",
                    "--schedule", str(work / "celerybeat")],
        "batches": [*celery, "-Q", "batches", "-n", "batches@%h", "--concurrency", "2"],
    }  # fmt: skip
    started = {name: spawn(command, logs[name], platform.env) for name, command in commands.items()}
    for name, popen in started.items():
        log = logs[name]
        wait_for(functools.partial(_says_ready, log), popen, name, log)
    return list(started.values())


def _says_ready(log: Path) -> bool:
    return b"ready" in log.read_bytes()


def _register_encoder() -> None:
    """all-MiniLM-L6-v2 behind `minilm`, registered and deployed as the demo does it."""
    from django.core.management import call_command

    from models_registry.models import Alias
    from models_registry.packaged import minilm_dir

    call_command(
        "register_model", "all-minilm-l6-v2", str(minilm_dir()), "--task", "embedding",
        "--alias", ENCODER,
    )  # fmt: skip
    version = Alias.objects.get(name=ENCODER).version
    call_command("create_deployment", ENCODER, version.public_name, "--dtype", "auto")


def _ratios(alone: list[float], under: list[float]) -> dict[str, float]:
    return {
        "p50_ratio": percentile(under, 0.5) / percentile(alone, 0.5),
        "p99_ratio": percentile(under, 0.99) / percentile(alone, 0.99),
        "p50_ms": percentile(under, 0.5) * 1000,
        "p99_ms": percentile(under, 0.99) * 1000,
    }


def _plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.4
    xs = range(len(names))
    p50 = [rows[n]["victim"]["p50_ratio"] for n in names]
    p99 = [rows[n]["victim"]["p99_ratio"] for n in names]
    ax.bar([x - width / 2 for x in xs], p50, width, label="V's p50 ratio")
    ax.bar([x + width / 2 for x in xs], p99, width, label="V's p99 ratio")
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET}")
    ax.set_xticks(list(xs), names, rotation=20)
    ax.set_ylabel("under the attack ÷ alone")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="V's requests per phase")
    parser.add_argument("--only", default="", help="comma-separated attacks (default: all)")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where to write results")
    args = parser.parse_args()
    chosen = [a for a in (args.only.split(",") if args.only else ATTACKS) if a]
    work = Path(tempfile.mkdtemp(prefix="roundhouse-bench-"))
    platform, sides = None, []
    rows: dict[str, dict[str, Any]] = {}
    try:
        from models_registry.demo_model import demo_model_build

        progress("building the tiny demo model")
        model_dir = demo_model_build(out_dir=work / "model")
        # A has a new tenant's default quota, as on the demo; V as much as it likes.
        platform = prepare_roundhouse(
            model_dir, work, tenants={"attacker": DEFAULT_QUOTA, "victim": {}}, max_num_seqs=8
        )
        _register_encoder()
        os.sched_setaffinity(0, {1})
        with roundhouse_stack(platform, work / "rh", engine_cpus="0", platform_cpus="1") as target:
            sides = _side_processes(platform, work)
            url, model, keys = target.base_url, target.model, target.api_keys
            frontend = target.processes["frontend"]
            progress("preparing: files, a stored response")
            ctx = {"url": url, "model": model, "key": keys["attacker"]}
            if "downloads" in chosen:
                big = _jsonl(40_000, 1150, valid=True)
                ctx["file_id"] = asyncio.run(_upload(url, keys["attacker"], big, "big.jsonl"))
            if "batches" in chosen:
                bad = _jsonl(50_000, 0, valid=False)
                ctx["bad_file_id"] = asyncio.run(_upload(url, keys["attacker"], bad, "bad.jsonl"))
            ctx["response_id"] = asyncio.run(_stored_response(url, model, keys["attacker"]))
            one = _jsonl(1, 8, valid=True).replace(b'"tiny"', json.dumps(model).encode())
            victim_file = asyncio.run(_upload(url, keys["victim"], one, "one.jsonl"))

            def victim_requests() -> Measured:
                return asyncio.run(_victim(url, model, keys["victim"], args.requests))

            def victim_batches() -> list[float]:
                return [
                    asyncio.run(_victim_batch(url, model, keys["victim"], victim_file))
                    for _ in range(3)
                ]

            progress(f"V alone: {args.requests} chats and file lists, three one-line batches")
            chats, reads, sent = victim_requests()
            stages_alone = _stages(sent)
            batch_alone = victim_batches()
            for name in chosen:
                progress(f"V under {name}: {DESCRIBED[name]}")
                if name == "batches":
                    under, codes, grew = _under(name, ctx, victim_batches, frontend)
                    rows[name] = {"victim": _ratios(batch_alone, under), "measure": "batch"}
                else:
                    (c, r, under_sent), codes, grew = _under(name, ctx, victim_requests, frontend)
                    rows[name] = {
                        "victim": _ratios(chats, c),
                        "reads": _ratios(reads, r),
                        "stages": _stages(under_sent),
                        "measure": "chat",
                    }
                rows[name].update(answers=codes, memory_growth_mb=grew)
    finally:
        stop(sides)
        platform_stop(platform)
        shutil.rmtree(work, ignore_errors=True)
    alone = {
        "chat_p50_ms": percentile(chats, 0.5) * 1000,
        "chat_p99_ms": percentile(chats, 0.99) * 1000,
        "files_p50_ms": percentile(reads, 0.5) * 1000,
        "batch_p50_s": percentile(batch_alone, 0.5),
    }
    lines = [
        "| attack | V's measure | p50 ratio | p99 ratio | V's file list p50 ratio | "
        "frontend memory growth | A's answers |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        v = row["victim"]
        reads_ratio = f"{row['reads']['p50_ratio']:.2f}" if "reads" in row else "–"
        answers = ", ".join(
            f"{k}: {n}" for k, n in collections.Counter(row["answers"]).most_common(3)
        )
        measure = "one-line batch" if row["measure"] == "batch" else "chat"
        lines.append(
            f"| {DESCRIBED[name]} | {measure} | {v['p50_ratio']:.2f} | {v['p99_ratio']:.2f} | "
            f"{reads_ratio} | {row['memory_growth_mb']:+.0f} MB | {answers} |"
        )
    stage_names = list(stages_alone)
    lines += [
        "",
        "Where V's chat spent its time (medians, ms): frontend (sent → admitted), queue "
        "(admitted → the engine took it), engine (→ the first token), rest (the other tokens "
        "and the way back).",
        "",
        "| | " + " | ".join(stage_names) + " |",
        "|---" * (len(stage_names) + 1) + "|",
        "| alone | " + " | ".join(f"{stages_alone[n]:.1f}" for n in stage_names) + " |",
    ]
    for name, row in rows.items():
        if "stages" in row:
            found = row["stages"]
            cells = " | ".join(f"{found.get(n, float('nan')):.1f}" for n in stage_names)
            lines.append(f"| {name} | {cells} |")
    table = "\n".join(lines)
    print("\n" + table)
    args.docs.mkdir(parents=True, exist_ok=True)
    _plot(rows, plot_path(args.docs, "attacks"))
    section_write(
        args.docs,
        "attacks",
        "## Attacks, one at a time\n\n"
        f"`bench/attacks.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, tiny "
        "Llama demo model and all-MiniLM-L6-v2. Tenant A (a new tenant's default quota: 600 "
        "requests and 200,000 tokens a minute, 64 at once) runs each attack from a process of "
        "its own, its clients reading as little as they can; tenant V sends "
        f"{args.requests} short chats, each followed by a list of its files, alone and then "
        "under the attack (the batches attack: V's one-line batch, three times). The engine "
        "on core 0; frontend, ingester, encoder, Celery and clients on core 1. Ratio = V's "
        f"figure under the attack ÷ alone (target ≤ {TARGET}). Alone: chat p50 "
        f"{alone['chat_p50_ms']:.0f} ms, p99 {alone['chat_p99_ms']:.0f} ms; file list p50 "
        f"{alone['files_p50_ms']:.1f} ms; one-line batch {alone['batch_p50_s']:.1f} s.\n\n"
        + table
        + "\n\n![attacks](img/attacks.png)\n",
    )
    results_write(
        args.docs,
        "attacks",
        {
            "section": "attacks",
            "summary": {
                **{f"{n}_p50_ratio": r["victim"]["p50_ratio"] for n, r in rows.items()},
                **{f"{n}_p99_ratio": r["victim"]["p99_ratio"] for n, r in rows.items()},
            },
            "targets": {f"{n}_{p}_ratio": f"≤ {TARGET}" for n in rows for p in ("p50", "p99")},
            "alone": {**alone, "stages_ms": stages_alone},
            "attacks": rows,
        },
    )


if __name__ == "__main__":
    main()
