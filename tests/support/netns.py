"""A worker host of its own on this machine: a network namespace joined to this one by a veth
pair, reaching the database and Redis through forwarders on this side of the link, so that
setting the link down cuts the host off (packets dropped, connections hanging, as in a real
partition) and setting it up heals it. Root only."""

from __future__ import annotations

import os
import socket
import subprocess
import threading


def available() -> bool:
    return os.geteuid() == 0 and subprocess.run(["ip", "netns", "list"],
                                                capture_output=True).returncode == 0


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Forwarder:
    """Accepts on `address` and relays each connection to `target`."""

    def __init__(self, address: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(address)
        self.address = self.listener.getsockname()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
                far = socket.create_connection(self.target)
            except OSError:
                return
            self.sockets += [near, far]
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        for end in self.sockets:
            try:
                end.shutdown(socket.SHUT_RDWR)  # wakes its pump (close alone does not)
            except OSError:
                pass
            end.close()


class WorkerHost:
    """`name` is the namespace; `url(host, port)` gives the address that reaches
    host:port on this side from inside it."""

    def __init__(self, index: int):
        self.name = f"tollgate-{os.getpid()}-{index}"
        self.link = f"tg{os.getpid() % 100000}h{index}"
        # A subnet per parallel test worker (gw0, gw1, ...) and host, so hosts of tests
        # running at once never share an address.
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
        subnet = f"10.231.{(worker * 16 + index) % 256}"
        self.inside_address = f"{subnet}.2"
        self.outside_address = f"{subnet}.1"
        self.forwarders: list[Forwarder] = []
        ip("netns", "add", self.name)
        try:
            ip("link", "add", self.link, "type", "veth", "peer", "name", "eth-tollgate",
               "netns", self.name)
            ip("addr", "add", f"{self.outside_address}/30", "dev", self.link)
            ip("link", "set", self.link, "up")
            for command in (("addr", "add", f"{self.inside_address}/30", "dev", "eth-tollgate"),
                            ("link", "set", "eth-tollgate", "up"), ("link", "set", "lo", "up")):
                ip("-n", self.name, *command)
        except subprocess.CalledProcessError:
            self.close()
            raise

    def reach(self, host: str, port: int) -> tuple[str, int]:
        """The (address, port) that reaches host:port of this side from inside the host."""
        forwarder = Forwarder((self.outside_address, 0), (host, port))
        self.forwarders.append(forwarder)
        return forwarder.address

    def cut(self) -> None:
        ip("link", "set", self.link, "down")

    def heal(self) -> None:
        ip("link", "set", self.link, "up")

    def close(self) -> None:
        for forwarder in self.forwarders:
            forwarder.close()
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
