"""A real HTTP receiver on 127.0.0.1 that records every request and answers from a script."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """``answers``: status codes to give in turn (then 200); ``redirect_to`` for 3xx."""

    server: ThreadingHTTPServer
    requests: list[Received] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= count, timeout)
            return list(self.requests)


def start_receiver() -> Iterator[Receiver]:
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec = holder["r"]
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with rec.arrived:
                rec.requests.append(Received(self.path, dict(self.headers.items()), body))
                code = rec.answers.pop(0) if rec.answers else 200
                rec.arrived.notify_all()
            self.send_response(code)
            if 300 <= code < 400:
                self.send_header("Location", "/redirected")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder["r"] = Receiver(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["r"]
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class SilentReceiver:
    """A TCP listener on 127.0.0.1 that accepts every connection and never answers (a
    webhook URL that never answers): counts the connections and the most open at once."""

    server: socket.socket
    accepted: int = 0
    most_open: int = 0
    open: set[socket.socket] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}/never"

    def _serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed, or the accept timeout: look at ``stop`` again
                continue
            with self.lock:
                self.accepted += 1
                self.open.add(conn)
                self.most_open = max(self.most_open, len(self.open))
            threading.Thread(target=self._hold, args=(conn, stop), daemon=True).start()

    def _hold(self, conn: socket.socket, stop: threading.Event) -> None:
        """Read (and drop) what the sender writes until it hangs up; never answer."""
        conn.settimeout(0.2)
        with conn:
            while not stop.is_set():
                try:
                    if not conn.recv(65536):
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            with self.lock:
                self.open.discard(conn)


def start_silent_receiver() -> Iterator[SilentReceiver]:
    server = socket.create_server(("127.0.0.1", 0), backlog=256)
    server.settimeout(0.2)
    silent = SilentReceiver(server)
    stop = threading.Event()
    thread = threading.Thread(target=silent._serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield silent
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
