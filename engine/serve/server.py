"""Running the app on uvicorn: the bind rules, a socket bound before start (so a busy port is a clear
error, not a log line), the foreground run of the command line and the background thread of the app."""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading

import uvicorn

from engine.errors import DFlashError

GRACEFUL_S = 60  # Ctrl+C / Stop: running requests get this long to finish before they are cancelled


class BindError(DFlashError):
    """The address cannot be served: not loopback without a key, or the port is taken."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Binding beyond this machine needs an API key: anyone who can reach the port could use the model."""
    if not is_loopback(host) and not api_key:
        raise BindError(f"Refusing to listen on {host} without an API key: every machine that can reach this "
                        "address could use the model. Set an API key (--api-key KEY; clients send it as "
                        "'Authorization: Bearer KEY'), or listen on 127.0.0.1 (this machine only).")


def bind_socket(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise BindError(f"port={port} is outside 0..65535.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "is in use by another program" if exc.errno in (98, 48, 10048) else f"cannot be bound ({exc.strerror})"
        raise BindError(f"{host}:{port} {why}: pick another port (--port), or stop the other server.") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_for(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/v1"


class UvicornServer:
    """One uvicorn server over an already bound socket."""

    def __init__(self, app, sock: socket.socket, graceful_s: float = GRACEFUL_S, log_level: str = "warning") -> None:
        self.sock = sock
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_s, lifespan="off",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def run(self) -> None:
        """Serve in this thread until Ctrl+C (uvicorn: the first one drains, a second one forces)."""
        self.server.run(sockets=[self.sock])

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                                        name="dflash-serve-http", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return bool(self.server.started)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> bool:
        """Drain (running requests finish, up to the graceful limit) and stop; True when stopped."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            stopped = not self._thread.is_alive()
        else:
            stopped = True
        if stopped:
            self.sock.close()
        return stopped


def http_server(bridge, host: str, port: int, api_key: str | None, graceful_s: float = GRACEFUL_S) -> UvicornServer:
    """The app of `bridge` on a socket bound now (check_bind first): the command line, the app and tests."""
    from engine.serve.app import create_app

    check_bind(host, api_key)
    return UvicornServer(create_app(bridge, api_key), bind_socket(host, port), graceful_s)
