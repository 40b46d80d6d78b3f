"""Settings for production: real servers, secrets and hosts come from the environment."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import content_keys_parse

DEBUG = False
SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
ALLOWED_HOSTS = os.environ["DJANGO_ALLOWED_HOSTS"].split(",")
# Never the key base.py derives from SECRET_KEY: retained text needs keys of its own to rotate.
SWITCHYARD_CONTENT_KEYS = content_keys_parse(os.environ["SWITCHYARD_CONTENT_KEYS"])
if not SWITCHYARD_CONTENT_KEYS:
    raise ImproperlyConfigured("SWITCHYARD_CONTENT_KEYS must name at least one Fernet key")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
