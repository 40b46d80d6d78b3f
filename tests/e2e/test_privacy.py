"""What the platform's processes log: never a key's secret, never a prompt or a completion."""

from __future__ import annotations

import httpx

from tests.conftest import ALIAS

PROMPT = "Quietly remember the violet heron 7731"


def test_logs_carry_no_key_secret_and_no_prompt_or_completion(stack, world):
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        answered = client.post(
            "/v1/chat/completions",
            json={
                "model": ALIAS,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 8,
            },
            headers={"Authorization": f"Bearer {world.acme_key}"},
        )
        # A refused key and a malformed body are what a server is tempted to echo.
        client.post("/v1/completions", json={"model": ALIAS, "prompt": PROMPT},
                    headers={"Authorization": f"Bearer {world.revoked_key}"})  # fmt: skip
        client.post("/v1/completions", json={"model": ALIAS, "prompt": PROMPT, "n": "x"},
                    headers={"Authorization": f"Bearer {world.acme_key}"})  # fmt: skip
    assert answered.status_code == 200, answered.text
    completion = answered.json()["choices"][0]["message"]["content"]
    # Everything the frontend, worker and ingester logged in this session so far.
    logs = "\n".join(p.tail(1_000_000) for p in (stack.frontend, stack.worker, stack.ingester))
    assert "engine ready" in logs  # the logs are really there
    secrets = [world.acme_key, world.globex_key, world.revoked_key, world.expired_key,
               world.models_only_key, *world.limited_keys.values()]  # fmt: skip
    for token in secrets:
        assert token not in logs
        assert token[16:] not in logs  # not even the secret part alone
    assert PROMPT not in logs
    if len(completion.strip()) >= 12:
        assert completion not in logs
