"""One bounded network probe for every check that asks "can this host be reached?": the W&B
server (``host.check_trackers``), the Hugging Face Hub (``data.hub_offline``) and the rendezvous
endpoint (``doctor``).

``socket.create_connection``'s timeout bounds the connection, not the name lookup before it
(``getaddrinfo`` takes no timeout; a resolver that does not answer holds the caller for as long as
``resolv.conf``'s timeouts and attempts add up to, per name server). So the whole attempt runs in a
daemon thread given ``timeout``; a lookup still hanging after it is left to finish on its own. A
child started meanwhile is safe from it: ``shared/lifeline.py`` does nothing after the fork that
such a thread could block.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

TIMEOUT_S = 3.0  # a route that takes longer to connect is not one a run can rely on


def connect_error(host: str, port: int, timeout: float | None = None) -> str | None:
    """Why a TCP connection to ``host:port`` cannot be made within ``timeout`` seconds (name
    lookup included), or None when it can."""
    timeout = TIMEOUT_S if timeout is None else timeout
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{host}:{port}: {err.strerror or err}")

    worker = threading.Thread(target=connect, name=f"probe {host}:{port}", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"{host}:{port}: no answer within {timeout:g} s"


def reachable(url: str, timeout: float | None = None) -> str | None:
    """Why ``url``'s host cannot be reached over TCP (its port, else 443 for https and 80 for
    http), or None."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port or (80 if parsed.scheme == "http" else 443)
    return connect_error(host, port, timeout)
