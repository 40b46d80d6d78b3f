"""`manage.py demo`: the whole platform on this machine, in the foreground."""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import socket

# Runs nvidia-smi only.
import subprocess  # nosec B404
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from embedded.servers import ServiceConfig, ServiceError, services_start, services_stop
from embedded.supervisor import Supervisor
from embedded.valkey_cluster import Cluster, cluster_start, cluster_stop
from models_registry.models import Alias, Deployment, DeploymentState
from models_registry.packaged import minilm_dir
from tenants.models import Role, Tenant
from tenants.services import api_key_issue, membership_add, tenant_create

DEMO_TENANT = "acme"
DEMO_ALIAS = "tiny-chat"
DEMO_DEPLOYMENT = "tiny-chat"
EMBEDDING_ALIAS = "minilm"  # all-MiniLM-L6-v2, from its PyPI package
ADMIN_USER = "admin"


class Command(BaseCommand):
    help = (
        "Run the whole platform on this machine: embedded Postgres and Valkey, the frontend, "
        "a vLLM worker, the usage ingester and Celery, until Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("ROUNDHOUSE_PORT", "8000")),
            help="HTTP port of the frontend (default: $ROUNDHOUSE_PORT or 8000)",
        )
        parser.add_argument(
            "--no-celery", action="store_true", help="do not start the Celery worker and beat"
        )
        parser.add_argument(
            "--cluster",
            action="store_true",
            help="run the data plane on an embedded Valkey Cluster (three primaries with a "
            "replica each); the plain Valkey keeps the control plane",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        data_dir = Path(settings.DATA_DIR)
        data_dir.mkdir(parents=True, exist_ok=True)
        # Held until this process exits, whichever way: the kernel releases it.
        self._lock = demo_lock(data_dir)
        port_free_check(options["port"])
        embedded = self._services(data_dir)
        cluster = self._cluster(data_dir) if options["cluster"] else None
        supervisor: Supervisor | None = None
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            self._prepare(data_dir)
            password = self._admin_password()
            token = api_key_issue(
                tenant=Tenant.objects.get(slug=DEMO_TENANT), name=f"demo {time.strftime('%F %T')}"
            ).token
            base_url = f"http://127.0.0.1:{options['port']}"
            supervisor = self._start(options["port"], not options["no_celery"])
            self._wait_ready(supervisor, base_url, stop)
            env_file = self._write_env(data_dir, base_url, token, password)
            self._banner(base_url, token, password, env_file)
            while not stop.is_set():
                dead = supervisor.dead()
                if dead is not None:
                    raise CommandError(f"{dead.name} exited; stopping the demo")
                stop.wait(0.5)
            self.stdout.write("\nstopping ...")
        finally:
            if supervisor is not None:
                supervisor.stop()
            if cluster is not None:
                cluster_stop(cluster.root)
            if embedded is not None:
                services_stop(embedded)
            self.stdout.write("demo stopped")

    def _services(self, data_dir: Path) -> ServiceConfig | None:
        if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
            self.stdout.write("using DATABASE_URL and REDIS_URL from the environment")
            return None
        config = ServiceConfig(
            data_dir=data_dir,
            pg_port=int(os.environ.get("ROUNDHOUSE_PG_PORT", "54329")),
            redis_port=int(os.environ.get("ROUNDHOUSE_REDIS_PORT", "63799")),
        )
        try:
            endpoints = services_start(config)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"postgres {endpoints.database_url}\nvalkey   {endpoints.redis_url}")
        return config

    def _cluster(self, data_dir: Path) -> Cluster:
        """Start the embedded cluster and point this process and its children's data plane at it."""
        self.stdout.write("starting a Valkey Cluster (3 primaries, 3 replicas) ...")
        try:
            cluster = cluster_start(data_dir / "valkey-cluster")
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        # The plain server stays the control plane's (Celery, cache, change messages).
        control = settings.REDIS_URL
        for name, value in (
            ("CONTROL_REDIS_URL", control),
            ("REDIS_URL", cluster.url),
            ("REDIS_CLUSTER", "1"),
        ):
            os.environ[name] = value
        settings.CONTROL_REDIS_URL = control
        settings.REDIS_URL = cluster.url
        settings.REDIS_CLUSTER = True
        nodes = " ".join(f"{n.name}={n.address}" for n in cluster.nodes)
        self.stdout.write(f"cluster  {nodes}")
        return cluster

    def _prepare(self, data_dir: Path) -> None:
        self.stdout.write("migrating ...")
        call_command("migrate", verbosity=0)
        model_dir = data_dir / "models" / "tiny-llama"
        call_command("build_demo_model", "--out", str(model_dir))
        if not Alias.objects.filter(name=DEMO_ALIAS).exists():
            call_command(
                "register_model",
                "tiny-llama",
                str(model_dir),
                "--price-input",
                "0.0005",
                "--price-output",
                "0.0015",
                "--tool-parser",
                "hermes",
                "--alias",
                DEMO_ALIAS,
            )
        if not Deployment.objects.filter(name=DEMO_DEPLOYMENT).exists():
            version = Alias.objects.get(name=DEMO_ALIAS).version
            call_command(
                "create_deployment",
                DEMO_DEPLOYMENT,
                version.public_name,
                "--kv-cache-mib",
                "256",
                "--max-model-len",
                "2048",
                # On CPU, graph compilation costs ~20 s of start-up for ~10% throughput.
                *(["--enforce-eager"] if not _has_gpu() else []),
            )
        if not Alias.objects.filter(name=EMBEDDING_ALIAS).exists():
            call_command(
                "register_model",
                "all-minilm-l6-v2",
                str(minilm_dir()),
                "--task",
                "embedding",
                "--price-input",
                "0.00002",
                "--alias",
                EMBEDDING_ALIAS,
            )
        if not Deployment.objects.filter(name=EMBEDDING_ALIAS).exists():
            version = Alias.objects.get(name=EMBEDDING_ALIAS).version
            call_command(
                "create_deployment", EMBEDDING_ALIAS, version.public_name, "--dtype", "auto"
            )
        if not Tenant.objects.filter(slug=DEMO_TENANT).exists():
            tenant_create(slug=DEMO_TENANT, name="Acme Corp")

    def _admin_password(self) -> str:
        password = secrets.token_urlsafe(12)
        user, _ = User.objects.get_or_create(username=ADMIN_USER)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        membership_add(
            tenant=Tenant.objects.get(slug=DEMO_TENANT), username=ADMIN_USER, role=Role.ADMIN
        )
        return password

    def _start(self, port: int, celery: bool) -> Supervisor:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
        env.setdefault("ROUNDHOUSE_LOG_FORMAT", "plain")  # people read these; pipelines get JSON
        supervisor = Supervisor(cwd=Path(settings.BASE_DIR), env=env, out=sys.stdout)
        py = sys.executable
        supervisor.start(
            "web",
            [py, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
             # The access log stays on: its lines show the demo's requests as they come.
             "--port", str(port),
             # The server refuses a WebSocket frame over the limit before reading it all.
             "--ws-max-size", str(settings.ROUNDHOUSE_WS_MAX_FRAME_BYTES)],
        )  # fmt: skip
        # Metrics ports beside the API's: 9400 the chat worker, 9401 the ingester, 9402 the
        # encoder (a busy port only costs that process its metrics, with a warning).
        supervisor.start(
            "worker",
            [py, "manage.py", "run_worker", "--deployment", DEMO_DEPLOYMENT,
             "--metrics-port", "9400"],
        )  # fmt: skip
        supervisor.start(
            "encoder",
            [py, "manage.py", "run_worker", "--deployment", EMBEDDING_ALIAS,
             "--metrics-port", "9402"],
        )  # fmt: skip
        supervisor.start("ingester", [py, "manage.py", "run_ingester", "--metrics-port", "9401"])
        if celery:
            # Two workers, as deployed: the periodic control jobs (and beat) on one, the batch
            # runners' turns on the other, so a control job never waits behind a batch step.
            # One process reading both queues would not do: its slots can all be in batch
            # steps (ROUNDHOUSE_BATCH_RUNNERS of them may be queued), and Celery reserves none.
            celery_worker = [py, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO"]
            supervisor.start(
                "control",
                [*celery_worker, "-Q", "control", "-n", "control@%h", "--concurrency", "1",
                 "--beat", "--schedule", str(Path(settings.DATA_DIR) / "celerybeat")],
            )  # fmt: skip
            supervisor.start(
                "batches",
                [*celery_worker, "-Q", "batches", "-n", "batches@%h", "--concurrency", "2"],
            )  # fmt: skip
        return supervisor

    def _wait_ready(self, supervisor: Supervisor, base_url: str, stop: threading.Event) -> None:
        def ready() -> bool:
            if stop.is_set():
                raise CommandError("interrupted")
            state = (
                Deployment.objects.filter(name=DEMO_DEPLOYMENT)
                .values_list("state", flat=True)
                .first()
            )
            try:
                up = httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                up = False
            return up and state == DeploymentState.READY

        if not supervisor.wait_until(ready, what="the vLLM worker to load", timeout=600):
            dead = supervisor.dead()
            raise CommandError(
                f"{dead.name} exited before the platform was ready" if dead else "not ready"
            )

    def _write_env(self, data_dir: Path, base_url: str, token: str, password: str) -> Path:
        env_file = data_dir / "demo.env"
        # Exported, so programs started after `source .data/demo.env` see them too.
        env_file.write_text(
            f"export ROUNDHOUSE_URL={base_url}\n"
            f"export ROUNDHOUSE_API_KEY={token}\n"
            f"export ROUNDHOUSE_ADMIN_USER={ADMIN_USER}\n"
            f"export ROUNDHOUSE_ADMIN_PASSWORD={password}\n"
        )
        env_file.chmod(0o600)
        return env_file

    def _banner(self, base_url: str, token: str, password: str, env_file: Path) -> None:
        self.stdout.write(
            "\n"
            "==================== Roundhouse is running ====================\n"
            f"  API         {base_url}/v1   (models: {DEMO_ALIAS}, {EMBEDDING_ALIAS})\n"
            f"  API key     {token}\n"
            f"  console     {base_url}/console/   user {ADMIN_USER}  password {password}\n"
            f"  admin       {base_url}/admin/   (same user)\n"
            f"  metrics     {base_url}/metrics (workers :9400 :9402, ingester :9401)\n"
            f"  saved to    {env_file}\n"
            "\n"
            f"  curl {base_url}/v1/chat/completions \\\n"
            f'    -H "Authorization: Bearer {token}" \\\n'
            '    -H "Content-Type: application/json" \\\n'
            f'    -d \'{{"model": "{DEMO_ALIAS}", "messages": '
            '[{"role": "user", "content": "Hello!"}], "max_tokens": 32}\'\n'
            "\n"
            "  Ctrl-C stops everything.\n"
            "================================================================\n"
        )
        self.stdout.flush()


def demo_lock(data_dir: Path) -> IO[str]:
    """Take the data directory's demo lock, or refuse: a demo already runs from it.

    A second demo would otherwise half-start beside the first (its ports taken, warnings)
    and, stopping, stop the first one's embedded servers.
    """
    handle = (data_dir / "demo.lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        pid = handle.read().strip() or "unknown"
        handle.close()
        raise CommandError(
            f"a demo already runs from {data_dir} (pid {pid}): stop it with Ctrl-C in its "
            f"terminal, or `kill {pid}`"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def port_free_check(port: int) -> None:
    """Refuse to start when something already listens on the demo's HTTP port."""
    with socket.socket() as probe:
        # As uvicorn binds: a port left in TIME_WAIT by a demo that just stopped is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise CommandError(
                f"port {port} is in use: a demo may already run (stop it with Ctrl-C in its "
                "terminal), or choose another with --port or ROUNDHOUSE_PORT"
            ) from None


def _has_gpu() -> bool:
    from shutil import which

    smi = which("nvidia-smi")
    if smi is None:
        return False
    # A fixed argument list, no shell.
    listed = subprocess.run([smi, "-L"], capture_output=True, check=False)  # nosec B603
    return listed.returncode == 0
