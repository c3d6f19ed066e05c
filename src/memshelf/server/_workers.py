"""Several worker processes, each with a listening socket of its own (SO_REUSEPORT), kept running by this process.

uvicorn's own workers share one listening socket. Whichever process wakes first accepts most new connections, and
a client's keep-alive connections then stay with it: a benchmark round ran on one process or on two, by chance
(BENCHMARKS.md, "HTTP: one worker-thread hop per request"). With SO_REUSEPORT each worker listens on a socket of its
own bound to the same address, and Linux spreads new connections over them by a hash of the connection's addresses.

The supervisor (this process) holds the port from the start: it binds a socket of the group that never listens, so
a second server cannot join the group by mistake (it is refused: the port is in use) and port 0 becomes one port for
every worker. It restarts a worker that dies after it has started serving; one that fails before then stops the
whole server with an error, since its replacement would fail the same way. SIGINT or SIGTERM stop every worker (each
finishes the requests it holds) and make `serve_workers` return, with the caller's signal handlers put back.

Linux only: elsewhere SO_REUSEPORT does not spread connections (macOS, BSD) or does not exist (Windows), and
`reuse_port_spreads()` tells the caller to use uvicorn's workers.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Any

from ..errors import ConfigError, MemshelfError

__all__ = ["reuse_port_spreads", "serve_workers"]

APP = "memshelf.server:app_from_env"
STOP_SECONDS = 30.0
"""How long a stopping worker may take to finish its requests before it is killed."""

logger = logging.getLogger("uvicorn.error")


def reuse_port_spreads() -> bool:
    """Whether the kernel spreads connections over the sockets of one SO_REUSEPORT group (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def _group_socket(host: str, port: int) -> socket.socket:
    """A TCP socket of the port's SO_REUSEPORT group, bound. IPPROTO_TCP, not 0: uvicorn sets TCP_NODELAY only on
    such sockets' connections (without it a request can stall 40 ms; BENCHMARKS.md, "HTTP server load")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def _held_port(host: str, port: int) -> Iterator[int]:
    """The port, held for the workers' group while the server runs; refused if anything else has it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        if port:  # a socket outside the group is refused by any socket on the port, of a group or not
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        held = _group_socket(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}: pass another --port, or stop "
                          "the server that has this one") from exc
    with held:
        yield int(held.getsockname()[1])


def _worker(options: dict[str, Any], ready: Event) -> None:  # pragma: no cover - runs in the worker process
    """One worker: its own listening socket in the group, and uvicorn serving the app on it."""
    import uvicorn

    class Announced(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                ready.set()

    config = uvicorn.Config(APP, factory=True, **options)
    sock = _group_socket(config.host, config.port)
    sock.listen(config.backlog)
    Announced(config).run(sockets=[sock])


class _Worker:
    def __init__(self, context: Any, options: dict[str, Any]) -> None:
        self.ready = context.Event()
        self.process: BaseProcess = context.Process(target=_worker, args=(options, self.ready), daemon=False)
        self.process.start()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()  # SIGTERM: uvicorn finishes the requests it holds, then exits

    def wait(self, deadline: float) -> None:
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def serve_workers(options: dict[str, Any], workers: int) -> None:
    """Run `workers` processes serving the app (memshelf.server.app_from_env, configured by the environment this
    process has) on options' host and port, with uvicorn's other `options`; blocks until SIGINT or SIGTERM."""
    import uvicorn

    uvicorn.Config(APP, factory=True, **options)  # logging set up as the workers will have it
    host = options.get("host", "127.0.0.1")
    context = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    with _held_port(host, int(options.get("port", 8000))) as port:
        options = {**options, "host": host, "port": port}
        previous = {number: signal.signal(number, lambda *_: stopping.set())
                    for number in (signal.SIGINT, signal.SIGTERM)}
        running: list[_Worker] = []
        try:
            logger.info("memshelf: %d workers on %s:%d, each with its own socket (SO_REUSEPORT)", workers, host, port)
            running.extend(_Worker(context, options) for _ in range(workers))
            while not stopping.wait(0.2):
                for at, worker in enumerate(running):
                    if worker.process.is_alive():
                        continue
                    if not worker.ready.is_set():
                        raise MemshelfError(f"a worker process exited with {worker.process.exitcode} before it "
                                            "could serve: read the log above, fix what it names, and start again")
                    logger.warning("memshelf: worker [%s] exited with %s; starting another", worker.process.pid,
                                   worker.process.exitcode)
                    running[at] = _Worker(context, options)
        finally:
            for worker in running:
                worker.stop()
            deadline = time.monotonic() + STOP_SECONDS
            for worker in running:
                worker.wait(deadline)
            for number, handler in previous.items():
                signal.signal(number, handler)
