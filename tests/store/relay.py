"""A TCP relay between a store client and PostgreSQL that a test cuts and restores.

The machine's PostgreSQL stays up; what the client sees through the relay is a database that
went away (`down`: connections closed, new ones refused), a network partition (`partition`:
connections stay open and silent, new ones are accepted and never answered), or a link that
loses every answer (`answers_lost`: what the client sends still arrives, so a COMMIT lands
though its reply never comes back). `restore` resumes forwarding and drops every connection
that lived through the fault, as a server that noticed its client gone would.
"""

from __future__ import annotations

import socket
import threading
import time

from sqlalchemy.engine import make_url


class Relay:
    """Relays a free local port to the server of `pg_url`; `url` is `pg_url` through the relay."""

    def __init__(self, pg_url: str) -> None:
        server = make_url(pg_url)
        self.target = (server.host or "127.0.0.1", server.port or 5432)
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = server.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)
        self.mode = "open"
        self._listening = False
        self._stopped = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, name="relay", daemon=True)
        self._thread.start()
        self._wait_listening(True)

    def down(self) -> None:
        self.mode = "down"
        self._wait_listening(False)
        self._drop_all()

    def partition(self) -> None:
        self.mode = "partition"

    def answers_lost(self) -> None:
        self.mode = "answers_lost"

    def restore(self) -> None:
        self._drop_all()
        self.mode = "open"
        self._wait_listening(True)

    def close(self) -> None:
        self._stopped = True
        self._drop_all()
        self._thread.join(5)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_listening(self, listening: bool) -> None:
        deadline = time.monotonic() + 5
        while self._listening != listening:
            assert time.monotonic() < deadline, "the relay did not follow"
            time.sleep(0.005)

    def _drop_all(self) -> None:
        with self._lock:
            held, self._sockets = self._sockets, []
        for sock in held:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _serve(self) -> None:
        listener = None
        while not self._stopped:
            if self.mode == "down":
                if listener is not None:
                    listener.close()  # refused from now on
                    listener, self._listening = None, False
                time.sleep(0.01)
                continue
            if listener is None:
                listener = socket.create_server(("127.0.0.1", self.port))
                listener.settimeout(0.02)
                self._listening = True
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self._sockets.append(client)
            if self.mode != "open":
                continue  # accepted and never answered; closed by restore()
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets.append(upstream)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()
        if listener is not None:
            listener.close()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        try:
            while data := src.recv(65536):
                if self.mode == "open" or (self.mode == "answers_lost" and to_server):
                    dst.sendall(data)
        except OSError:
            pass  # dropped by down() or restore()
