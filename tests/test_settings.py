"""Production settings pass Django's deployment checks; every variable they read is documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_production_settings_pass_the_deployment_checks():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.prod",
        "DJANGO_SECRET_KEY": "x7" * 30 + "-a-long-random-production-secret",
        "DJANGO_ALLOWED_HOSTS": "api.example.com",
        "ROUNDHOUSE_CONTENT_KEYS": "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleTA=",
        "DATABASE_URL": "postgresql://roundhouse:pw@db.example.com:5432/roundhouse",
        "REDIS_URL": "redis://redis.example.com:6379/0",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def _demo_settings(script: str) -> subprocess.CompletedProcess[str]:
    """Run Python under the settings `make demo` runs with, as a fresh shell has them."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_DEBUG", "DJANGO_ALLOWED_HOSTS")}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.dev"
    return subprocess.run(
        [sys.executable, "-c", f"import django\ndjango.setup()\n{script}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_demo_runs_without_debug_pages_on_loopback_hosts():
    done = _demo_settings(
        "from django.conf import settings\nprint(settings.DEBUG, sorted(settings.ALLOWED_HOSTS))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "False ['127.0.0.1', '[::1]', 'localhost']"


def test_a_console_404_in_the_demo_is_the_plain_page_and_static_files_still_load():
    done = _demo_settings(
        "from django.test import Client\n"
        "client = Client(HTTP_HOST='127.0.0.1:8000')\n"
        "for path in ('/static/console/console.css', '/static/console/console.js',\n"
        "             '/static/vendor/htmx.min.js', '/static/admin/css/base.css'):\n"
        "    print(client.get(path).status_code, end=' ')\n"
        "answer = client.get('/console/no-such-page')\n"
        "print(answer.status_code)\n"
        "print(answer.content.decode())"
    )
    assert done.returncode == 0, done.stderr
    status, _, page = done.stdout.partition("\n")
    assert status == "200 200 200 200 404"
    assert "Page not found" in page and "console/console.css" in page
    assert "URLconf" not in page and "admin/" not in page  # no list of URL patterns


def test_a_server_error_is_the_plain_page():
    done = _demo_settings(
        "from django.test import RequestFactory\n"
        "from django.views.defaults import server_error\n"
        "answer = server_error(RequestFactory().get('/console/', HTTP_HOST='127.0.0.1'))\n"
        "print(answer.status_code)\n"
        "print(answer.content.decode())"
    )
    assert done.returncode == 0, done.stderr
    status, _, page = done.stdout.partition("\n")
    assert status == "500"
    assert "Something went wrong" in page and "console/console.css" in page


def _documented_variables() -> set[str]:
    """The variables docs/configuration.md names; `…_PORT` after `DJANGO_EMAIL_HOST` in one
    cell is `DJANGO_EMAIL_PORT`."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        for cell in line.split("|"):
            prefix = ""
            for name in re.findall(r"`(…_[A-Z0-9_]+|[A-Z][A-Z0-9_]*)`", cell):
                if name.startswith("…"):
                    names.add(prefix + name[1:])
                else:
                    names.add(name)
                    prefix = name.rsplit("_", 1)[0]
    return names


def test_every_variable_the_settings_read_is_on_the_configuration_page():
    read = {
        name
        for path in (ROOT / "config" / "settings").glob("*.py")
        for name in re.findall(
            r"(?:env_[a-z]+|environ\.get|getenv)\(\s*\"([A-Z][A-Z0-9_]+)\"", path.read_text()
        )
    }
    assert len(read) > 50  # the pattern still finds how settings read them
    assert sorted(read - _documented_variables()) == []
