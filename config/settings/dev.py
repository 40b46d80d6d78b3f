"""Settings for `make demo` and local development."""

from __future__ import annotations

from config.settings.base import *  # noqa: F403
from config.settings.base import env_bool, env_str

# The demo is what people try the platform with, so it looks like production to its users: no
# debug pages that print settings, tracebacks or every URL pattern. DJANGO_DEBUG=1 turns them
# on for development.
DEBUG = env_bool("DJANGO_DEBUG", False)
# The demo listens on the loopback interface only.
ALLOWED_HOSTS = [
    h for h in env_str("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h
]
WHITENOISE_USE_FINDERS = True  # static files served in place: no collectstatic needed
