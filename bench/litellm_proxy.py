"""LiteLLM's proxy as its users run it: virtual keys and spend tracking in PostgreSQL.

LiteLLM lives in a virtualenv of its own under .data/bench-venvs/litellm (its dependencies
clash with the project's), built on first use from pinned releases:

- litellm[proxy] 1.105.3, the newest release whose pinned dependencies all install from the
  package index at the time of writing (later ones pin certifi, litellm-proxy-extras and
  litellm-enterprise releases the index does not serve yet);
- prisma (Prisma Client Python) 0.11.0, the release LiteLLM's proxy is written against: it
  swaps the client's private `_Prisma__engine`, which later releases renamed.

Prisma Client Python talks GraphQL over HTTP to Prisma's `query-engine` binary, which
`prisma generate` downloads from Prisma's own server, and the benchmark installs from package
registries only (PyPI, npm). npm ships Prisma's engine compiled to WebAssembly
(@prisma/query-engine-wasm 5.17.0, with node-postgres through @prisma/adapter-pg), so
bench/litellm_prisma_engine.mjs runs that engine behind the binary's HTTP interface.
LiteLLM's schema comes from its own migration files (what `prisma migrate deploy` would
apply), and its start-up schema update is off, because that step needs Prisma's schema-engine
binary too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
from psycopg import sql

from bench.common import ROOT, Target, free_port, http_ok, progress, stop, wait_for

LITELLM_VERSION = "1.105.3"
PRISMA_CLIENT_VERSION = "0.11.0"
PIP_PINS = (f"litellm[proxy]=={LITELLM_VERSION}", f"prisma=={PRISMA_CLIENT_VERSION}")
ENGINE_PACKAGES = {
    "@prisma/query-engine-wasm": "5.17.0-31.393aa359c9ad4a4bb28630fb5613f9c281cde053",
    "@prisma/adapter-pg": "5.17.0",
    "@prisma/driver-adapter-utils": "5.17.0",
    "pg": "8.13.1",
    "postgres-array": "3.0.2",
}
HOME = ROOT / ".data" / "bench-venvs" / "litellm"
ENGINE_SOURCE = Path(__file__).with_name("litellm_prisma_engine.mjs")
MASTER_KEY = "sk-bench-master"
DATABASE = "litellm"


@dataclass(frozen=True)
class LiteLLM:
    """A ready LiteLLM installation: its virtualenv and the environment its proxy runs with."""

    venv: Path
    env: dict[str, str]

    @property
    def site_packages(self) -> Path:
        return next((self.venv / "lib").glob("python3*/site-packages"))


def litellm_install(home: Path = HOME) -> LiteLLM:
    """Build (or reuse) the virtualenv, the query engine and the generated Prisma client."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise SystemExit("LiteLLM's database client needs Node.js and npm on PATH")
    venv = home / "venv"
    _venv_ensure(venv)
    engine = home / "prisma-engine"
    _engine_ensure(engine)
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRISMA_HOME_DIR": str(home / "prisma-home"),
        "PRISMA_BINARY_CACHE_DIR": str(home / "prisma-cli"),
        "PRISMA_NODEENV_CACHE_DIR": str(home / "nodeenv"),
        "PRISMA_QUERY_ENGINE_BINARY": str(engine / "query-engine"),
        "PRISMA_SCHEMA_ENGINE_BINARY": str(engine / "schema-engine"),
        "PRISMA_HIDE_UPDATE_MESSAGE": "true",
    }
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    litellm = LiteLLM(venv=venv, env=env)
    _client_generate(litellm)
    return litellm


def _venv_ensure(venv: Path) -> None:
    marker = venv / ".bench-pins"
    if marker.exists() and marker.read_text() == "\n".join(PIP_PINS):
        return
    # A previous install with other pins can leave Prisma's generated client behind.
    shutil.rmtree(venv, ignore_errors=True)
    progress(f"creating LiteLLM's virtualenv in {venv.relative_to(ROOT)} (a few minutes, once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "on", *PIP_PINS],
        check=True,
    )
    marker.write_text("\n".join(PIP_PINS))


def _engine_ensure(engine: Path) -> None:
    engine.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ENGINE_SOURCE, engine / ENGINE_SOURCE.name)
    _script_write(engine / "query-engine", f'exec node "$(dirname "$0")/{ENGINE_SOURCE.name}" "$@"')
    _script_write(
        engine / "schema-engine",
        "echo 'no Prisma schema engine here: the benchmark applies the migrations' >&2; exit 1",
    )
    package = {"name": "litellm-prisma-engine", "private": True, "dependencies": ENGINE_PACKAGES}
    manifest = json.dumps(package, indent=2)
    marker = engine / ".installed"
    if marker.exists() and marker.read_text() == manifest:
        return
    progress("installing Prisma's WebAssembly query engine from npm")
    (engine / "package.json").write_text(manifest)
    subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=engine, check=True)
    marker.write_text(manifest)


def _script_write(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _client_generate(litellm: LiteLLM) -> None:
    schema = litellm.site_packages / "litellm" / "proxy" / "schema.prisma"
    digest = hashlib.sha256(schema.read_bytes()).hexdigest()
    marker = litellm.venv / ".prisma-generated"
    if marker.exists() and marker.read_text() == digest:
        return
    progress("generating LiteLLM's Prisma client (installs the Prisma CLI from npm once)")
    subprocess.run(
        [str(litellm.venv / "bin" / "prisma"), "generate", "--schema", str(schema)],
        env=litellm.env,
        cwd=schema.parent,
        check=True,
    )
    marker.write_text(digest)


def litellm_database_create(litellm: LiteLLM, admin_url: str) -> str:
    """Create LiteLLM's database beside the platform's and apply LiteLLM's migrations to it.

    `admin_url` is any URL of the cluster with rights to create a database; returns LiteLLM's.
    """
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    url = urllib.parse.urlsplit(admin_url)._replace(path=f"/{DATABASE}").geturl()
    migrations = litellm.site_packages / "litellm_proxy_extras" / "migrations"
    steps = sorted(p for p in migrations.iterdir() if (p / "migration.sql").is_file())
    progress(f"applying LiteLLM's {len(steps)} migrations")
    with psycopg.connect(url, autocommit=True) as conn:
        for step in steps:
            conn.execute((step / "migration.sql").read_text())
    return url


@contextlib.contextmanager
def litellm_proxy(
    litellm: LiteLLM,
    *,
    upstream: Target,
    database_url: str,
    work: Path,
    cpus: str | None = None,
    extra_processes: dict[str, psutil.Process] | None = None,
) -> Iterator[Target]:
    """Run LiteLLM's proxy with one model in front of `upstream`, and issue a virtual key.

    The key (Target.api_keys["bench"]) is made by /key/generate with a budget, as a LiteLLM
    operator would hand one to a team; every request through it is authenticated against the
    database-backed key and its spend is logged and added up there.
    """
    work.mkdir(parents=True, exist_ok=True)
    config = work / "litellm.yaml"
    # JSON is YAML: the project's venv need not have a YAML writer.
    config.write_text(json.dumps(_config(upstream), indent=2))
    port = free_port()
    env = {
        **litellm.env,
        "DATABASE_URL": database_url,
        "DISABLE_SCHEMA_UPDATE": "true",
        # Rather than fetch its model price map at start-up, use the copy LiteLLM ships.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # Same log level as Roundhouse's frontend in these benchmarks: no access log.
        "LITELLM_LOG": "WARNING",
    }
    args = [str(litellm.venv / "bin" / "litellm"), "--config", str(config),
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if cpus:
        args = ["taskset", "-c", cpus, *args]
    log = work / "litellm.log"
    popen = subprocess.Popen(
        args, cwd=work, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_ok(f"{base_url}/health/liveliness"), popen, "LiteLLM proxy", log)
        key = _key_generate(base_url)
        yield Target(
            name="litellm",
            base_url=base_url,
            model=upstream.model,
            api_keys={"bench": key},
            processes={"litellm": psutil.Process(popen.pid), **(extra_processes or {})},
        )
    finally:
        stop([popen])


def _config(upstream: Target) -> dict[str, object]:
    return {
        "model_list": [
            {
                "model_name": upstream.model,
                "litellm_params": {
                    "model": f"hosted_vllm/{upstream.model}",
                    "api_base": f"{upstream.base_url}/v1",
                    "api_key": "none",
                    # Priced like a small hosted model, so spend is tracked in dollars.
                    "input_cost_per_token": 1e-7,
                    "output_cost_per_token": 2e-7,
                },
            }
        ],
        "general_settings": {"master_key": MASTER_KEY},
    }


def _key_generate(base_url: str) -> str:
    body = json.dumps({"key_alias": "bench", "models": ["tiny"], "max_budget": 1_000_000})
    request = urllib.request.Request(
        f"{base_url}/key/generate",
        data=body.encode(),
        headers={"Authorization": f"Bearer {MASTER_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # nosec B310 (loopback)
        return str(json.load(response)["key"])


@dataclass(frozen=True)
class Spend:
    """What LiteLLM recorded in its database."""

    log_rows: int  # LiteLLM_SpendLogs rows, one per request
    key_dollars: float  # the bench key's spend
    transactions: int  # committed transactions in LiteLLM's database since it was created


def litellm_spend(database_url: str, *, settle_s: float = 30.0) -> Spend:
    """Return what LiteLLM recorded once its batched spend writes have settled.

    LiteLLM queues spend and writes it every few seconds.
    """
    last = Spend(-1, -1.0, -1)
    deadline = time.monotonic() + settle_s
    while True:
        with psycopg.connect(database_url) as conn:
            rows = conn.execute('SELECT count(*) FROM "LiteLLM_SpendLogs"').fetchone()
            spend = conn.execute(
                'SELECT coalesce(sum(spend), 0) FROM "LiteLLM_VerificationToken" '
                "WHERE key_alias = 'bench'"
            ).fetchone()
            xacts = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        now = Spend(
            log_rows=int(rows[0]) if rows else 0,
            key_dollars=float(spend[0]) if spend else 0.0,
            transactions=int(xacts[0]) if xacts else 0,
        )
        if (now.log_rows, now.key_dollars) == (last.log_rows, last.key_dollars):
            return now
        if time.monotonic() > deadline:
            return now
        last = now
        time.sleep(6)
