"""Settings for the test session: the embedded services it starts are passed in by URL."""

from __future__ import annotations

from config.settings.base import *  # noqa: F403

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# As in production: what the tests change reaches the frontends through change messages.
ROUNDHOUSE_KEY_CACHE_SECONDS = 30.0
ROUNDHOUSE_ROUTE_CACHE_SECONDS = 30.0
ROUNDHOUSE_LEASE_SECONDS = 3.0
WHITENOISE_USE_FINDERS = True  # static files served in place: no collectstatic needed
ROUNDHOUSE_BATCH_STEP_SECONDS = 4.0
ROUNDHOUSE_BATCH_LEASE_SECONDS = 3
# Small, so that a file of a few thousand lines is validated over several steps.
ROUNDHOUSE_BATCH_VALIDATE_LINES = 500
