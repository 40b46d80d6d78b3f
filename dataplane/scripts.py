"""The data plane's Lua scripts, read once from dataplane/lua/ when this module is imported.

Each script a client registers (`register_script`) is one of the sources below: the queue
scripts start with the queue prelude (the deployment's keys and shared helpers), the quota
scripts with the token-bucket prelude. The autoscaling hysteresis and the API's idempotency keys
are here too, so that every script the platform runs is a .lua file.
"""

from __future__ import annotations

from pathlib import Path

_DIR = Path(__file__).resolve().parent / "lua"


def _read(name: str) -> str:
    return (_DIR / f"{name}.lua").read_text(encoding="utf-8")


_QUEUE_PRELUDE = _read("queue_prelude")
_QUOTA_PRELUDE = _read("quota_prelude")

# One deployment's queue (KEYS: dataplane.keys.DeploymentKeys, then the script's own).
ENQUEUE = _QUEUE_PRELUDE + _read("enqueue")
CLAIM = _QUEUE_PRELUDE + _read("claim")
FINALIZE = _QUEUE_PRELUDE + _read("finalize")
UNQUEUE = _QUEUE_PRELUDE + _read("unqueue")
REQUEUE = _QUEUE_PRELUDE + _read("requeue")
# One request of a deployment (KEYS: the deployment's jobs, the request's final and fence keys).
SHUT_OUT = _read("shut_out")

# One tenant's limits (KEYS: dataplane.keys.QuotaKeys, or the ones each script names).
QUOTA_ADMIT = _QUOTA_PRELUDE + _read("quota_admit")
QUOTA_RELEASE = _read("quota_release")
QUOTA_TAKE_REQUEST = _QUOTA_PRELUDE + _read("quota_take_request")
QUOTA_PEEK = _QUOTA_PRELUDE + _read("quota_peek")
QUOTA_TAKE_BYTES = _QUOTA_PRELUDE + _read("quota_take_bytes")

# An autoscaling signal's hysteresis (dataplane.autoscale; KEYS: dataplane.keys.autoscale_key)
# and, the API's, an Idempotency-Key's record (KEYS: the key's record).
AUTOSCALE_HYSTERESIS = _read("autoscale_hysteresis")
IDEMPOTENCY_BEGIN = _read("idempotency_begin")
IDEMPOTENCY_BIND = _read("idempotency_bind")
IDEMPOTENCY_TAKE = _read("idempotency_take")
IDEMPOTENCY_RELEASE = _read("idempotency_release")
