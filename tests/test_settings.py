"""Production settings pass Django's deployment checks."""

from __future__ import annotations

import os
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
        "SWITCHYARD_CONTENT_KEYS": "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleTA=",
        "DATABASE_URL": "postgresql://switchyard:pw@db.example.com:5432/switchyard",
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
