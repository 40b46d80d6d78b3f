"""Settings for production: real servers, secrets and hosts come from the environment."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import content_keys_parse, env_bool, env_int

DEBUG = False
SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
ALLOWED_HOSTS = os.environ["DJANGO_ALLOWED_HOSTS"].split(",")
# Never the key base.py derives from SECRET_KEY: retained text needs keys of its own to rotate.
ROUNDHOUSE_CONTENT_KEYS = content_keys_parse(os.environ["ROUNDHOUSE_CONTENT_KEYS"])
if not ROUNDHOUSE_CONTENT_KEYS:
    raise ImproperlyConfigured("ROUNDHOUSE_CONTENT_KEYS must name at least one Fernet key")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The console and admin are HTTPS only: plain HTTP is redirected and browsers are told to
# remember that for a year. /v1, health and metrics skip this stack (config/asgi.py), so
# probes and scrapers inside the cluster keep working over plain HTTP.
SECURE_SSL_REDIRECT = env_bool("ROUNDHOUSE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("ROUNDHOUSE_HSTS_SECONDS", 365 * 24 * 3600)
# These two bind every subdomain of the operator's domain, which this app cannot know about:
# off unless the operator opts in, and their deployment-check warnings waived for that reason.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("ROUNDHOUSE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("ROUNDHOUSE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]
