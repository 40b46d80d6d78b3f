"""Settings for `make demo` and local development."""

from __future__ import annotations

from config.settings.base import *  # noqa: F403
from config.settings.base import env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)
WHITENOISE_USE_FINDERS = True  # static files served in place: no collectstatic needed
