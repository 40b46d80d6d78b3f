"""Settings shared by every environment; each value can be set from the environment."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from decimal import Decimal
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from dataplane.keys import DJANGO_CACHE_PREFIX

BASE_DIR = Path(__file__).resolve().parent.parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


DATA_DIR = Path(env_str("ROUNDHOUSE_DATA_DIR", str(BASE_DIR / ".data"))).resolve()


def embedded_urls() -> dict[str, str]:
    """Return the URLs the embedded services recorded when they started, if any."""
    try:
        recorded = json.loads((DATA_DIR / "services.json").read_text())
    except (OSError, ValueError):
        return {}
    urls = {}
    for service, name in (("postgres", "database_url"), ("valkey", "redis_url")):
        entry = recorded.get(service) if isinstance(recorded, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("url"), str):
            urls[name] = entry["url"]
    return urls


_embedded = embedded_urls()
DATABASE_URL = os.environ.get("DATABASE_URL") or _embedded.get(
    "database_url",
    f"postgresql://postgres@127.0.0.1:{env_int('ROUNDHOUSE_PG_PORT', 54329)}/roundhouse",
)
REDIS_URL = os.environ.get("REDIS_URL") or _embedded.get(
    "redis_url", f"redis://127.0.0.1:{env_int('ROUNDHOUSE_REDIS_PORT', 63799)}/0"
)
# REDIS_URL names one node of a Valkey (Redis) Cluster: the data plane's clients are cluster
# clients, which learn the other nodes from it (docs/scale-out.md).
REDIS_CLUSTER = env_bool("REDIS_CLUSTER", False)
# The control plane's Valkey: Celery's broker, Django's cache (sign-in lockout) and the
# change and key-revocation messages frontends listen to. None of those speaks Cluster, so
# with REDIS_CLUSTER this must name a plain server; without, it is REDIS_URL's.
CONTROL_REDIS_URL = os.environ.get("CONTROL_REDIS_URL") or REDIS_URL
# A frontend's script calls made in one turn of its event loop go to the one Valkey in one
# round trip (dataplane.coalesce); off, each goes on its own (a cluster's always do).
ROUNDHOUSE_REDIS_COALESCE = env_bool("ROUNDHOUSE_REDIS_COALESCE", True)
if REDIS_CLUSTER and "CONTROL_REDIS_URL" not in os.environ:
    raise ImproperlyConfigured(
        "REDIS_CLUSTER=1 needs CONTROL_REDIS_URL: a plain Valkey for Celery, the cache and "
        "the control plane's messages"
    )

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("DJANGO_ALLOWED_HOSTS", "*").split(",") if h]


def content_keys_parse(raw: str) -> list[str]:
    return [key.strip() for key in raw.split(",") if key.strip()]


def content_key_derive(secret_key: str) -> str:
    """Return a Fernet key derived from a secret (development and tests only)."""
    digest = hashlib.sha256(b"roundhouse-content-key|" + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


# Fernet keys for retained prompt and completion text (the privacy app), comma-separated: the
# first encrypts, every one decrypts, so a new key goes first and an old one is dropped once the
# text it sealed has expired. Without the variable, development and tests use one key derived
# from SECRET_KEY: deterministic, so a dev database stays readable across restarts, and never
# used in production, where prod.py refuses to start without the variable.
ROUNDHOUSE_CONTENT_KEYS = content_keys_parse(env_str("ROUNDHOUSE_CONTENT_KEYS", "")) or [
    content_key_derive(SECRET_KEY)
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "django_prometheus",
    "embedded",
    "tenants",
    "privacy",
    "models_registry",
    "safety",
    "inference",
    "billing",
    "rollouts",
    "workers",
    "batches",
    "console",
]

# The /v1 data plane bypasses this stack (see config/asgi.py): these serve the admin and console.
MIDDLEWARE = [
    # django-prometheus times every console and management request (django_http_* series).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Before anything reads the query or form into the database (a NUL there is a 500).
    "config.middleware.NulRefusedMiddleware",
    # Serves the console's and admin's static files (collected, or found in place in dev).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "config.middleware.ContentSecurityPolicyMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]
# Headers on every console, admin and management page. Scripts and styles load from this
# site's static files only (no inline ones: static/console/console.js holds the console's);
# no page may be framed, sniffed as another type, or leak its URL to another origin.
ROUNDHOUSE_CONTENT_SECURITY_POLICY = env_str(
    "ROUNDHOUSE_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'",
)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
        # PostgreSQL through django-prometheus's wrapper: queries and errors as django_db_*.
        engine="django_prometheus.db.backends.postgresql",
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# The image collects static files at build time into a folder of its own (read-only at run time).
STATIC_ROOT = Path(env_str("ROUNDHOUSE_STATIC_ROOT", str(DATA_DIR / "static")))
# `make install` copies the npm packages the console uses (Chart.js, htmx) into static/vendor.
STATICFILES_DIRS = [BASE_DIR / "static"]
# Shared by every frontend: sign-in lockout counters live here.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": CONTROL_REDIS_URL,
        "KEY_PREFIX": DJANGO_CACHE_PREFIX,
    }
}
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:home"
# Sign-in lockout: this many failures for one username within the window lock it for the window.
ROUNDHOUSE_LOGIN_FAILURES = env_int("ROUNDHOUSE_LOGIN_FAILURES", 5)
ROUNDHOUSE_LOGIN_LOCK_SECONDS = env_int("ROUNDHOUSE_LOGIN_LOCK_SECONDS", 900)
# The only password check: console, admin and HTTP Basic on the API all count against the lockout.
AUTHENTICATION_BACKENDS = ["tenants.lockout.LockoutBackend"]

EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("ROUNDHOUSE_FROM_EMAIL", "roundhouse@localhost")
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_str("DJANGO_EMAIL_TLS", "0") == "1"

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", CONTROL_REDIS_URL)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", CONTROL_REDIS_URL)
CELERY_TASK_SERIALIZER = "json"
# Two queues, each with workers of its own (docs/processes.md): `control` for the periodic jobs
# (rollout fail-fast and analysis, deployment state, purges, sweeps, budget alerts, invoices)
# and anything else queued, `batches` for the batch runners' turns. A control job never waits
# behind a batch step, however many batches are running.
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ROUTES = {"batches.tasks.batches_turn": {"queue": "batches"}}
# A worker process takes one task at a time and reserves none: a batch turn reserved behind a
# long step would wait there while another worker sits idle.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "rollouts-analyze": {
        "task": "rollouts.tasks.rollouts_analyze",
        "schedule": env_float("ROUNDHOUSE_ROLLOUT_ANALYSIS_SECONDS", 10.0),
    },
    "rollouts-fail-fast": {
        "task": "rollouts.tasks.rollouts_fail_fast",
        "schedule": env_float("ROUNDHOUSE_ROLLOUT_FAIL_FAST_SECONDS", 5.0),
    },
    # Drafts for the month that ended, at 01:00 UTC on the 1st; finance issues them.
    "invoices-build": {
        "task": "billing.tasks.invoices_build_last_month",
        "schedule": crontab(minute=0, hour=1, day_of_month=1),
    },
    "budget-alerts": {
        "task": "billing.tasks.budget_alerts_check",
        "schedule": 60.0,
    },
    # Batches whose runner died are taken over (a Celery worker that starts does it at once).
    "batches-resume": {
        "task": "batches.tasks.batches_resume",
        "schedule": 60.0,
    },
    "deployments-reconcile": {
        "task": "workers.tasks.deployments_reconcile",
        "schedule": 10.0,
    },
    # Retained prompt and completion text past its tenant's retention period is deleted.
    "privacy-content-purge": {
        "task": "privacy.tasks.content_purge",
        "schedule": crontab(minute=0),
    },
    # Background responses whose accepting frontend died are ended in the store.
    "inference-responses-orphans": {
        "task": "inference.tasks.responses_orphans_finish",
        "schedule": 60.0,
    },
    # Files (the Files API's) past their expiry are deleted, but those a running batch reads.
    "batches-files-purge": {
        "task": "batches.tasks.files_purge",
        "schedule": crontab(minute=10),
    },
    # Stored responses (the Responses API's) and conversations past their expiry are deleted.
    "inference-responses-purge": {
        "task": "inference.tasks.responses_purge",
        "schedule": crontab(minute=5),
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    # JSON bodies meet the same limits as /v1's (depth, lone surrogates; see config/json_body).
    "DEFAULT_PARSER_CLASSES": [
        "config.parsers.JSONParser",
        "config.parsers.FormParser",
        "config.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The management API's OpenAPI document, served at /api/schema. It is public, like the /v1
# one: it describes what the code already says, and each operation still checks who calls it.
SPECTACULAR_SETTINGS = {
    "TITLE": "Roundhouse management API",
    "DESCRIPTION": "Tenants' quotas and privacy, the model registry and rollouts, and finance. "
    "Staff only, except the finance reads a tenant's finance and admin members may make.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": "/api/",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # What Django's path converters match, so a client never builds a URL no route takes.
    "PATH_CONVERTER_OVERRIDES": {
        "int": {"type": "integer", "minimum": 0},
        "slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
        "str": {"type": "string", "pattern": "^[^/]+$"},
    },
    "ENUM_NAME_OVERRIDES": {
        "InvoiceStateEnum": "billing.models.InvoiceState",
        "RolloutStateEnum": "models_registry.models.RolloutState",
    },
}

# Logs: one JSON object per line (`json`, the default: what log pipelines parse) or readable
# lines (`plain`, what `make demo` uses); both carry the request and trace ids.
ROUNDHOUSE_LOG_FORMAT = env_str("ROUNDHOUSE_LOG_FORMAT", "json")
LOGGING_CONFIG = "config.logs.logging_configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "context": {"()": "dataplane.tracing.ContextFilter"},
        "redact": {"()": "config.log_redaction.RedactFilter"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "dataplane.tracing.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain" if ROUNDHOUSE_LOG_FORMAT == "plain" else "json",
            "filters": ["context", "redact"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("ROUNDHOUSE_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.request": {"level": "ERROR"},
        # uvicorn's own handlers would print its lines unfiltered (a WebSocket's request line
        # carries `?key=`): they go through the handler above instead, redacted. Django
        # configures logging after uvicorn, when the application is imported, in every process.
        # Each logger by name and without a level, so uvicorn's --log-level still holds.
        "uvicorn.error": {"handlers": ["console"], "propagate": False},
        # The access logger is left alone where uvicorn runs with --no-access-log (config.logs).
        "uvicorn.access": {"handlers": ["console"], "propagate": False},
        "uvicorn.asgi": {"handlers": ["console"], "propagate": False},
        # Celery's lines for each periodic job sent, received and succeeded (a dozen a minute
        # per control worker, nothing the jobs' own lines and metrics do not say): its
        # warnings, retries' errors and failures still come.
        "celery.beat": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}

# Metrics (docs/metrics.md). Workers and the ingester serve theirs on these ports (0: off).
# The host a process runs on, as its peers see it: its name (in worker ids), the address its
# servers listen on (metrics, vLLM's own sockets; 0.0.0.0 is every interface), and its zone.
# Several "hosts" can share a machine, each on its own loopback address (127.0.0.2, ...).
ROUNDHOUSE_HOST_NAME = env_str("ROUNDHOUSE_HOST_NAME", "")  # "" is the machine's host name
ROUNDHOUSE_BIND_ADDRESS = env_str("ROUNDHOUSE_BIND_ADDRESS", "0.0.0.0")  # nosec B104
ROUNDHOUSE_ZONE = env_str("ROUNDHOUSE_ZONE", "")
ROUNDHOUSE_WORKER_METRICS_PORT = env_int("ROUNDHOUSE_WORKER_METRICS_PORT", 0)
ROUNDHOUSE_INGESTER_METRICS_PORT = env_int("ROUNDHOUSE_INGESTER_METRICS_PORT", 0)
# Tenants named in the per-tenant token series; later ones are counted as `other`.
ROUNDHOUSE_METRICS_MAX_TENANTS = env_int("ROUNDHOUSE_METRICS_MAX_TENANTS", 200)
# The autoscaling signal falls only after its raw value stayed lower for this long.
ROUNDHOUSE_SCALE_DOWN_SECONDS = env_float("ROUNDHOUSE_SCALE_DOWN_SECONDS", 300.0)

# Largest request body the API accepts; larger ones get 413.
MAX_REQUEST_BYTES = env_int("ROUNDHOUSE_MAX_REQUEST_BYTES", 4 * 1024 * 1024)
# A tenant's bodies of at least this size (or of unknown size) are read at most that many at
# a time per frontend; the rest wait their turn unread.
ROUNDHOUSE_LARGE_BODY_BYTES = env_int("ROUNDHOUSE_LARGE_BODY_BYTES", 1024 * 1024)
ROUNDHOUSE_LARGE_BODIES_PER_TENANT = env_int("ROUNDHOUSE_LARGE_BODIES_PER_TENANT", 1)
# A request's rendering and tokenising past a few milliseconds runs on a frontend's preprocessing
# threads, at most that many of one tenant's at a time (the rest wait their turn), and a search
# for where truncation cuts a conversation stops once it has run this long.
ROUNDHOUSE_PREPROCESS_THREADS = env_int("ROUNDHOUSE_PREPROCESS_THREADS", 4)
ROUNDHOUSE_PREPROCESS_PER_TENANT = env_int("ROUNDHOUSE_PREPROCESS_PER_TENANT", 1)
ROUNDHOUSE_PREPROCESS_SECONDS = env_float("ROUNDHOUSE_PREPROCESS_SECONDS", 10.0)
# How many bytes of such bodies a tenant may send the inference endpoints a minute, counted from
# Content-Length before a body is read (a token bucket; 0: no limit).
ROUNDHOUSE_LARGE_BODY_BYTES_PER_MINUTE = env_int(
    "ROUNDHOUSE_LARGE_BODY_BYTES_PER_MINUTE", 64 * 1024 * 1024
)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES
# A response whose client reads none of a chunk for this long is cut and its connection
# closed (a stream's request is cancelled as on a disconnect); 0: never.
ROUNDHOUSE_WRITE_TIMEOUT_SECONDS = env_float("ROUNDHOUSE_WRITE_TIMEOUT_SECONDS", 30.0)
# WebSocket (/v1/ws): a larger frame closes its socket with 1009 (give the server the same
# limit: uvicorn's --ws-max-size); past this many frames waiting unread on one socket (or twice
# the frame limit in bytes) the socket is closed with 1008; an open socket's key is checked
# again this often, so a revoked key or a disabled tenant closes it.
ROUNDHOUSE_WS_MAX_FRAME_BYTES = env_int("ROUNDHOUSE_WS_MAX_FRAME_BYTES", MAX_REQUEST_BYTES)
ROUNDHOUSE_WS_MAX_WAITING_FRAMES = env_int("ROUNDHOUSE_WS_MAX_WAITING_FRAMES", 256)
ROUNDHOUSE_WS_KEY_CHECK_SECONDS = env_float("ROUNDHOUSE_WS_KEY_CHECK_SECONDS", 2.0)
# How many database calls (a file's chunk read, a list, a batch read) one tenant's requests run
# at once on a frontend, of its 4 database threads (at most 3): the rest of its calls wait
# their turn, and the other threads stay free for the other tenants.
ROUNDHOUSE_DB_CALLS_PER_TENANT = env_int("ROUNDHOUSE_DB_CALLS_PER_TENANT", 2)
# How many of one tenant's file downloads a frontend sends at once; its others wait their turn.
ROUNDHOUSE_DOWNLOADS_PER_TENANT = env_int("ROUNDHOUSE_DOWNLOADS_PER_TENANT", 2)

# Where registered model versions are stored, content-addressed and read-only.
ROUNDHOUSE_ARTIFACT_ROOT = Path(
    env_str("ROUNDHOUSE_ARTIFACT_ROOT", str(DATA_DIR / "artifacts"))
).resolve()
# Each worker host's copy of the versions it serves, fetched from their weights URIs (a
# version registered without one is fetched from the store above). 0: no size limit; above
# the limit, least recently used versions no worker process holds are evicted.
ROUNDHOUSE_WEIGHTS_CACHE_DIR = Path(
    env_str("ROUNDHOUSE_WEIGHTS_CACHE_DIR", str(DATA_DIR / "weights-cache"))
).resolve()
ROUNDHOUSE_WEIGHTS_CACHE_MAX_BYTES = env_int("ROUNDHOUSE_WEIGHTS_CACHE_MAX_BYTES", 0)
# How long a frontend serves a cached key, route or safety policy before reloading it. Changes
# publish a message that marks the cached state stale everywhere at once (a revocation drops
# the key); these bound staleness only when such a message is lost.
ROUNDHOUSE_KEY_CACHE_SECONDS = env_float("ROUNDHOUSE_KEY_CACHE_SECONDS", 30.0)
ROUNDHOUSE_ROUTE_CACHE_SECONDS = env_float("ROUNDHOUSE_ROUTE_CACHE_SECONDS", 30.0)
# A stream that has sent nothing for this long (queued, or in a long prefill) sends a keep-alive:
# an SSE comment, Anthropic's `ping` event on /v1/messages; so that a proxy's idle timeout does
# not cut it. 0: never.
ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS = env_float("ROUNDHOUSE_STREAM_KEEPALIVE_SECONDS", 10.0)
# A claimed job whose lease is not renewed for this long is reclaimed.
ROUNDHOUSE_LEASE_SECONDS = env_float("ROUNDHOUSE_LEASE_SECONDS", 5.0)
# Longest a request may take end to end before the frontend cancels it.
ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS = env_float("ROUNDHOUSE_REQUEST_TIMEOUT_SECONDS", 600.0)
# Reply streams outlive the request by this much so a slow reader can finish.
ROUNDHOUSE_REPLY_TTL_SECONDS = env_int("ROUNDHOUSE_REPLY_TTL_SECONDS", 900)
# Tokens of a stream produced within this many milliseconds travel as one event (the first
# token and the end never wait). 0 sends every engine step; raise it when many concurrent
# streams make per-token relaying cost more CPU than the engine can spare. Unset, the worker
# picks by its engine's device (workers/runner.py, stream_interval_ms): every step on
# an accelerator, whose host has cores to spare, and 20 ms on a CPU engine, which shares them.
ROUNDHOUSE_STREAM_INTERVAL_MS: float | None = (
    env_float("ROUNDHOUSE_STREAM_INTERVAL_MS", 0.0)
    if os.environ.get("ROUNDHOUSE_STREAM_INTERVAL_MS", "").strip()
    else None
)
# Up to this many running streams a worker writes each engine step's tokens as soon as it has
# them, whatever the stream interval (tokens flow as vLLM's server sends them); past it the
# interval above applies. 0: the interval applies at every load (the behaviour before).
ROUNDHOUSE_STREAM_FLOW_STREAMS = env_int("ROUNDHOUSE_STREAM_FLOW_STREAMS", 8)
# An alias whose recent requests mostly failed on the platform's side (engine errors, lost
# workers) sends its interactive requests to its fallback for a while
# (inference/pipeline/breaker.py). A minimum of 0 requests turns the breakers off.
ROUNDHOUSE_BREAKER_WINDOW_SECONDS = env_float("ROUNDHOUSE_BREAKER_WINDOW_SECONDS", 30.0)
ROUNDHOUSE_BREAKER_MIN_REQUESTS = env_int("ROUNDHOUSE_BREAKER_MIN_REQUESTS", 10)
ROUNDHOUSE_BREAKER_FAILURE_SHARE = env_float("ROUNDHOUSE_BREAKER_FAILURE_SHARE", 0.5)
ROUNDHOUSE_BREAKER_OPEN_SECONDS = env_float("ROUNDHOUSE_BREAKER_OPEN_SECONDS", 15.0)
# Tenants whose breakers must hold at once before every tenant's requests go on (1: any).
ROUNDHOUSE_BREAKER_MIN_TENANTS = env_int("ROUNDHOUSE_BREAKER_MIN_TENANTS", 2)
# A running canary that failed this share of at least that many requests in the window (while
# its baseline failed less than half as often) is rolled back at once; 0 requests: never.
ROUNDHOUSE_ROLLOUT_FAIL_FAST_ERROR_PCT = env_float("ROUNDHOUSE_ROLLOUT_FAIL_FAST_ERROR_PCT", 50.0)
ROUNDHOUSE_ROLLOUT_FAIL_FAST_MIN_REQUESTS = env_int("ROUNDHOUSE_ROLLOUT_FAIL_FAST_MIN_REQUESTS", 10)
ROUNDHOUSE_ROLLOUT_FAIL_FAST_WINDOW_SECONDS = env_float(
    "ROUNDHOUSE_ROLLOUT_FAIL_FAST_WINDOW_SECONDS", 60.0
)
# The canary's events an SLO needs in a rollout's long window before its burn can breach (the
# short window needs one): fewer make a burn rate noise.
ROUNDHOUSE_ROLLOUT_BURN_MIN_EVENTS = env_int("ROUNDHOUSE_ROLLOUT_BURN_MIN_EVENTS", 5)
# How many nice steps below the worker's event loop its engine's processes run (0: the same):
# the loop's work (claims, token relay, aborts) is short and waits on nothing else.
ROUNDHOUSE_ENGINE_NICE = env_int("ROUNDHOUSE_ENGINE_NICE", 19)
# The share of a worker's engine slots kept for tenants with nothing running on it, so a light
# tenant's request starts at once while another tenant's long requests fill the rest.
ROUNDHOUSE_RESERVED_SLOTS = env_float("ROUNDHOUSE_RESERVED_SLOTS", 0.125)
# Tokens one engine step computes at most (vLLM's max_num_batched_tokens), and the longest
# prefill chunk a request takes from a step it shares (0: the budget over max_num_seqs, which
# leaves room in every step for every sequence; see workers/fairness.py).
ROUNDHOUSE_ENGINE_MAX_BATCHED_TOKENS = env_int("ROUNDHOUSE_ENGINE_MAX_BATCHED_TOKENS", 2048)
ROUNDHOUSE_ENGINE_PREFILL_CHUNK_TOKENS = env_int("ROUNDHOUSE_ENGINE_PREFILL_CHUNK_TOKENS", 0)
# The most of one worker's engine one tenant may hold: its sequences (a share of max_num_seqs)
# and its KV-cache blocks (a share of the worker's). 1: no cap (for sequences, none beyond the
# shared slots: the reserved ones already keep a tenant to 7/8 of a worker).
ROUNDHOUSE_TENANT_MAX_SEQS_SHARE = env_float("ROUNDHOUSE_TENANT_MAX_SEQS_SHARE", 1.0)
ROUNDHOUSE_TENANT_MAX_KV_SHARE = env_float("ROUNDHOUSE_TENANT_MAX_KV_SHARE", 0.75)
# The least part of the jobs workers take that goes to batch-class work while interactive work
# waits too (at most 0.5), so sustained interactive load slows batch work but never starves it.
# 0: strict priority.
ROUNDHOUSE_BATCH_MIN_SHARE = env_float("ROUNDHOUSE_BATCH_MIN_SHARE", 0.05)
# The quota a new tenant starts with.
ROUNDHOUSE_DEFAULT_QUOTA: dict[str, int | Decimal] = {
    "requests_per_minute": env_int("ROUNDHOUSE_DEFAULT_RPM", 600),
    "tokens_per_minute": env_int("ROUNDHOUSE_DEFAULT_TPM", 200_000),
    "max_concurrency": env_int("ROUNDHOUSE_DEFAULT_MAX_CONCURRENCY", 64),
    "max_tokens_per_request": env_int("ROUNDHOUSE_DEFAULT_MAX_TOKENS", 1024),
    "max_context_tokens": env_int("ROUNDHOUSE_DEFAULT_MAX_CONTEXT", 8192),
    "monthly_budget": Decimal(env_str("ROUNDHOUSE_DEFAULT_MONTHLY_BUDGET", "100.00")),
    "priority_weight": env_int("ROUNDHOUSE_DEFAULT_PRIORITY_WEIGHT", 1),
}

# The Files and Batch APIs: the largest batch input file and the most requests it may hold.
ROUNDHOUSE_MAX_FILE_BYTES = env_int("ROUNDHOUSE_MAX_FILE_BYTES", 64 * 1024 * 1024)
ROUNDHOUSE_MAX_FILE_LINES = env_int("ROUNDHOUSE_MAX_FILE_LINES", 50_000)
# The bytes a tenant's files (uploads and batch results) may hold together in PostgreSQL; an
# upload past it is refused (storage_limit_exceeded) until files are deleted or expire, and a
# batch whose result files would pass it ends failed, its files holding the lines that fit.
ROUNDHOUSE_TENANT_FILE_BYTES = env_int("ROUNDHOUSE_TENANT_FILE_BYTES", 10 * 1024**3)
# The bytes a tenant's stored responses and conversations (their items included) may hold
# together in PostgreSQL; a write past it that the client asks for (a response to store, a
# conversation, its items) is refused (storage_limit_exceeded) until some are deleted or expire.
ROUNDHOUSE_TENANT_STORED_BYTES = env_int("ROUNDHOUSE_TENANT_STORED_BYTES", 1024**3)
# A batch job works in steps of this many seconds (short, so a Celery worker's warm shutdown
# is quick) and holds the batch's lease, renewed as it goes, which lapses this long after its
# runner dies; then the next step takes the batch over.
ROUNDHOUSE_BATCH_STEP_SECONDS = env_float("ROUNDHOUSE_BATCH_STEP_SECONDS", 20.0)
ROUNDHOUSE_BATCH_LEASE_SECONDS = env_int("ROUNDHOUSE_BATCH_LEASE_SECONDS", 30)
# The most lines of its input file one step of a batch validates (fewer once the step's time is
# up): a file of 50,000 lines is read over fifty steps, and other batches get steps in between.
ROUNDHOUSE_BATCH_VALIDATE_LINES = env_int("ROUNDHOUSE_BATCH_VALIDATE_LINES", 1000)
# A step that has run this long ends early for another tenant's batch waiting for a turn (its
# lines keep running, and its next step follows them).
ROUNDHOUSE_BATCH_STEP_LEAST_SECONDS = env_float("ROUNDHOUSE_BATCH_STEP_LEAST_SECONDS", 1.0)
# Batch runners: how many batch steps may run at once over every Celery worker of the `batches`
# queue (their total concurrency, or more). Each runner's turn steps the batch of the tenant
# served least recently, so tenants take turns however many batches each has.
ROUNDHOUSE_BATCH_RUNNERS = env_int("ROUNDHOUSE_BATCH_RUNNERS", 4)
# Requests one batch keeps admitted at once (they wait in the `batch` class for idle capacity).
ROUNDHOUSE_BATCH_IN_FLIGHT = env_int("ROUNDHOUSE_BATCH_IN_FLIGHT", 64)
# The part of each deployment's queue (its max_queued jobs and max_queued_tokens) that batch
# work may fill; interactive work may fill all of it, so overload sheds the batch class first.
ROUNDHOUSE_BATCH_QUEUE_SHARE = env_float("ROUNDHOUSE_BATCH_QUEUE_SHARE", 0.5)
# Output capping (a tenant's quota opts in): the smallest max_tokens a request that would finish
# after its deadline is capped to; when not even that fits, it runs as asked.
ROUNDHOUSE_CAPPED_MAX_TOKENS_FLOOR = env_int("ROUNDHOUSE_CAPPED_MAX_TOKENS_FLOOR", 16)
# Encoder workers: how long arrivals must pause before a partial batch runs (at most the
# queue delay derived from the deployment's SLO). 0: whenever the engine is free.
ROUNDHOUSE_BATCHER_QUIET_MS = env_float("ROUNDHOUSE_BATCHER_QUIET_MS", 0.0)
