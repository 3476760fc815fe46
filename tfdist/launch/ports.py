"""Ports for a local cluster: free ones, or checked fixed ones."""

import socket
from typing import List, Sequence

from tfdist.errors import ConfigurationError


def free_ports(count: int, host: str = "127.0.0.1") -> List[int]:
    """``count`` distinct ports that were free a moment ago on ``host``.

    Another process can take one before the task binds it; `launch` starts
    again with new ports when a task reports "address already in use".
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def check_ports_free(ports: Sequence[int], host: str = "127.0.0.1") -> None:
    """Raises `ConfigurationError` naming the first port that is taken."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError as error:
                raise ConfigurationError(
                    f"Port {port} on {host} is already in use ({error.strerror}); "
                    "choose other --ports or leave them out for free ports."
                ) from error
