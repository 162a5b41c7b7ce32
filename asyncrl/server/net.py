"""Sockets for the servers of this package."""

from __future__ import annotations

import socket


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one) for uvicorn to serve on. Taken before the model loads,
    so a port in use is refused at once; not listening yet, so clients get 'connection refused' (not a hang)
    until the server is ready. Created as IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets, and
    without it every small answer waited ~40 ms for the client's delayed ACK."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
