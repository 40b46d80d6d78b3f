"""Settings for the test session: the embedded services it starts are passed in by URL."""

from __future__ import annotations

from config.settings.base import *  # noqa: F403
from config.settings.base import SWITCHYARD

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SWITCHYARD["KEY_CACHE_SECONDS"] = 0.5
SWITCHYARD["ROUTE_CACHE_SECONDS"] = 0.5
SWITCHYARD["LEASE_SECONDS"] = 3.0
