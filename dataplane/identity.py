"""Names a process of the data plane (a worker, an ingester) gives itself among its peers."""

from __future__ import annotations

import os
import socket

from django.conf import settings


def host_name() -> str:
    """The name of the host this process runs on (ROUNDHOUSE_HOST_NAME, or the machine's)."""
    return str(settings.ROUNDHOUSE_HOST_NAME or socket.gethostname())


def worker_id_new() -> str:
    """Return an id unique to this process: the host's name and the process id."""
    return f"{host_name()}-{os.getpid()}"
