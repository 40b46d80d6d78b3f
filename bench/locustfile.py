"""Locust scenario: users of several tenants chatting (streamed), completing and embedding.

Each tenant in ROUNDHOUSE_KEYS gets its own user class, weighted by its share of the users.
A user thinks between requests, then streams a chat completion (most often), asks for a
non-streamed completion, or (when ROUNDHOUSE_EMBEDDING_MODEL names an encoder) embeds a few
sentences. Statistics are kept per tenant:

- `<tenant> chat stream`: the whole stream (status line to `[DONE]`), with a separate
  `TTFT` entry of the same name for the time to the first token;
- `<tenant> completion`, `<tenant> embeddings`: the whole response;
- `<tenant> <status> <code>` of type `REFUSED`: a 429 or 503 whose code says the platform or
  the tenant's quota is full (rate limits, `queue_full`, …). Expected under load, so not
  counted as failures; any other non-2xx response, a stream that ends in an error event and
  a connection error are failures.

Environment:

    ROUNDHOUSE_URL              the platform's base URL (or pass --host)
    ROUNDHOUSE_KEYS             "tenant:key[:weight],...": an API key per tenant and its share
                                of the users (1 when left out)
    ROUNDHOUSE_MODEL            the chat model or alias (default tiny-chat)
    ROUNDHOUSE_EMBEDDING_MODEL  an embeddings model; unset: no embeddings requests
    ROUNDHOUSE_THINK_SECONDS    "low-high": each user's pause between requests (default 1-5)

    .venv/bin/locust -f bench/locustfile.py --headless -u 60 -r 10 -t 5m --csv out/load

`bench/load.py` starts a platform on this machine and runs this scenario against it.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from typing import Any, cast

import requests
from locust import HttpUser, between, task

# The codes that say "not now": the tenant's quota or the platform's capacity is used up.
REFUSALS = {
    429: {
        "rate_limit_exceeded",
        "tokens_per_minute_exceeded",
        "concurrency_limit_exceeded",
        "budget_exceeded",
    },
    503: {"queue_full", "deadline_unattainable", "model_unavailable", "service_unavailable"},
}
EMBEDDING_MODEL = os.environ.get("ROUNDHOUSE_EMBEDDING_MODEL", "")
SYSTEM = "You are a concise assistant for a railway operations team."
QUESTIONS = [
    "Which points need switching before the 7:40 freight arrives?",
    "Summarise yesterday's delays on the northern line in three bullet points.",
    "Draft a short apology to passengers for the signal failure at Riverside.",
    "What is the difference between a siding and a passing loop?",
    "Translate 'platform four is closed for maintenance' into French and German.",
    "List the checks a driver does before leaving the depot.",
]
FOLLOW_UPS = ["Make it shorter.", "Now as a table.", "Why?", "Give one more example."]
PROMPTS = [
    "def parse_timetable(path):",
    "The signal box at the junction controls",
    "Invoice summary for November:",
    "SELECT train_id, departed_at FROM departures WHERE",
]
SENTENCES = [
    "Where is the nearest train station?",
    "The 7:40 freight is running twelve minutes late.",
    "Switch the points before the freight train arrives.",
    "Customers reported slower deliveries during the winter storms.",
    "How do I reset my password?",
    "Platform four is closed for maintenance until Friday.",
]


def _tenants() -> list[tuple[str, str, int]]:
    """Parse ROUNDHOUSE_KEYS into (tenant, key, weight) triples."""
    raw = os.environ.get("ROUNDHOUSE_KEYS", "")
    tenants = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        tenant, _, rest = item.partition(":")
        key, _, weight = rest.partition(":")
        if not tenant or not key:
            raise SystemExit(f"ROUNDHOUSE_KEYS: expected tenant:key[:weight], got {item!r}")
        tenants.append((tenant, key, int(weight or 1)))
    if not tenants:
        raise SystemExit("set ROUNDHOUSE_KEYS=tenant:key[:weight],... (one API key per tenant)")
    return tenants


def _think() -> Any:
    low, _, high = os.environ.get("ROUNDHOUSE_THINK_SECONDS", "1-5").partition("-")
    return between(float(low), float(high or low))


class RoundhouseUser(HttpUser):
    """A user of one tenant; the concrete classes below fill in the tenant and its key."""

    abstract = True
    host = os.environ.get("ROUNDHOUSE_URL", "http://127.0.0.1:8000")
    wait_time = _think()
    tenant = ""
    key = ""
    model = os.environ.get("ROUNDHOUSE_MODEL", "tiny-chat")

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {self.key}"
        self.history: list[dict[str, str]] = []
        self.end_user = f"{self.tenant}-user-{random.randrange(10_000)}"  # OpenAI's `user` tag

    @task(6)
    def chat_stream(self) -> None:
        """Stream a chat turn, sometimes following up on the previous one (three at most)."""
        if len(self.history) not in (3, 5) or random.random() < 0.5:
            self.history = [{"role": "system", "content": SYSTEM}]
            self.history.append({"role": "user", "content": random.choice(QUESTIONS)})
        else:
            self.history.append({"role": "user", "content": random.choice(FOLLOW_UPS)})
        body = {
            "model": self.model,
            "messages": self.history,
            "max_tokens": random.randint(16, 128),
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": self.end_user,
        }
        name = f"{self.tenant} chat stream"
        started = time.perf_counter()
        with self.client.post(
            "/v1/chat/completions", json=body, name=name, stream=True, catch_response=True
        ) as response:
            if not self._answered(response):
                return
            text, first, problem = _read_chat_stream(response)
            meta = cast(dict[str, Any], response.request_meta)
            meta["response_time"] = (time.perf_counter() - started) * 1000
            meta["response_length"] = len(text)
            if problem:
                response.failure(problem)
                return
            response.success()
        if first is not None:
            self.environment.events.request.fire(
                request_type="TTFT",
                name=name,
                response_time=(first - started) * 1000,
                response_length=0,
                exception=None,
                context={},
            )
        self.history.append({"role": "assistant", "content": text})

    @task(3)
    def completion(self) -> None:
        """Ask for a short completion, not streamed."""
        body = {
            "model": self.model,
            "prompt": random.choice(PROMPTS),
            "max_tokens": random.randint(16, 64),
        }
        with self.client.post(
            "/v1/completions", json=body, name=f"{self.tenant} completion", catch_response=True
        ) as response:
            if self._answered(response):
                response.success()

    @task(2 if EMBEDDING_MODEL else 0)
    def embeddings(self) -> None:
        """Embed a few sentences (only when ROUNDHOUSE_EMBEDDING_MODEL names a model)."""
        body = {"model": EMBEDDING_MODEL, "input": random.sample(SENTENCES, k=3)}
        with self.client.post(
            "/v1/embeddings", json=body, name=f"{self.tenant} embeddings", catch_response=True
        ) as response:
            if self._answered(response):
                response.success()

    def _answered(self, response: Any) -> bool:
        """Return whether the request was served; report refusals and failures otherwise."""
        if 200 <= response.status_code < 300:
            return True
        code = _error_code(response)
        if code in REFUSALS.get(response.status_code, ()):
            meta = cast(dict[str, Any], response.request_meta)
            meta["request_type"] = "REFUSED"
            meta["name"] = f"{self.tenant} {response.status_code} {code}"
            response.success()
        else:
            response.failure(f"{response.status_code} {code or response.text[:200]}")
        return False


def _read_chat_stream(response: Any) -> tuple[str, float | None, str]:
    """Read a chat completion's SSE stream: its text, when the first token came, what went wrong.

    The time is a perf_counter reading (None when no text came); what went wrong is "" for a
    stream that ends with `[DONE]` and no error event.
    """
    text, first, problem, done = [], None, "", False
    try:
        for line in response.iter_lines(decode_unicode=True):
            if line == "data: [DONE]":
                done = True
            if not line.startswith("data: ") or done:
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                problem = f"the stream ended in an error: {chunk['error'].get('code')}"
                continue
            choices = chunk.get("choices") or []
            delta = choices[0].get("delta", {}).get("content") if choices else None
            if delta:
                first = first or time.perf_counter()
                text.append(delta)
    except (requests.RequestException, ValueError) as exc:
        problem = f"the stream broke: {type(exc).__name__}"
    if not done and not problem:
        problem = "the stream ended without [DONE]"
    return "".join(text), first, problem


def _error_code(response: Any) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def _user_class(tenant: str, key: str, weight: int) -> type[RoundhouseUser]:
    name = "".join(part.title() for part in re.split(r"\W+", tenant) if part) + "User"
    attrs = {"tenant": tenant, "key": key, "weight": weight, "__module__": __name__}
    return type(name, (RoundhouseUser,), attrs)


# Locust runs every non-abstract User class it finds in this module: one per tenant.
globals().update({cls.__name__: cls for cls in (_user_class(*t) for t in _tenants())})
