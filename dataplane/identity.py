"""Names a process of the data plane (a worker, an ingester) gives itself among its peers."""

from __future__ import annotations

import os
import socket


def worker_id_new() -> str:
    """Return an id unique to this process: the host's name and the process id."""
    return f"{socket.gethostname()}-{os.getpid()}"
