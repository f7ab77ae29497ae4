"""A PostgreSQL primary and a synchronous streaming standby of the test's own, on free ports,
for failover: crash the primary, promote the standby, clone a new standby from it."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .processes import free_port


def binaries() -> Path | None:
    """The newest installed PostgreSQL server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda path: int(Path(path).parent.parent.name))
    return Path(found[-1]).parent if found else None


class Server:
    def __init__(self, pair: PostgresPair, name: str, port: int):
        self.pair, self.data, self.port = pair, pair.root / name, port

    def start(self, *options: str) -> None:
        settings = " ".join(("-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
                             "-c", f"unix_socket_directories={self.pair.root}", *options))
        self.pair.run("pg_ctl", "-D", self.data, "-l", f"{self.data}.log", "-o", settings,
                      "-w", "-t", "120", "start")

    def crash(self) -> None:
        """The postmaster and its backends stop at once, as in a power cut."""
        self.pair.run("pg_ctl", "-D", self.data, "-m", "immediate", "stop")

    def promote(self) -> None:
        self.pair.run("pg_ctl", "-D", self.data, "-w", "-t", "120", "promote")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.pair.run("pg_ctl", "-D", self.data, "-m", "immediate", "stop", check=False)

    def dsn(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"


class PostgresPair:
    """`servers[0]` starts as the primary, `servers[1]` as its synchronous standby: a commit
    returns only once the standby has it, so promoting the standby loses nothing committed.
    `size` ports are taken at once, so one URL names every server a test will start."""

    def __init__(self, size: int = 2):
        self.ports = [free_port() for _ in range(size)]
        self.bin = binaries()
        # Owned by the postgres user when this runs as root (the server refuses root).
        self.root = Path(tempfile.mkdtemp(prefix="tollgate-pg-"))
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres")
        self.servers: list[Server] = []

    def run(self, tool: str, *args, check: bool = True) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *map(str, args)], check=check,
                       capture_output=True, timeout=180)

    def start(self, database: str) -> None:
        primary = Server(self, "s0", self.ports[0])
        self.run("initdb", "-D", primary.data, "-A", "trust", "-U", "postgres", "--no-sync",
                 "-E", "UTF8")
        self._start_primary(primary)
        self.run("createdb", "-h", "127.0.0.1", "-p", primary.port, "-U", "postgres", database)
        self.servers.append(primary)
        self.add_standby()

    def _start_primary(self, server: Server) -> None:
        server.start("-c", "synchronous_commit=on", "-c", "wal_level=replica",
                     "-c", "max_wal_senders=10")

    def add_standby(self) -> Server:
        """Clone the primary into a new standby, then make the primary wait for it on every
        commit. (Set after the clone, so a clone promoted later does not wait for a standby
        it does not have, as a failover manager would arrange.)"""
        primary = self.servers[-1]
        count = self._made = getattr(self, "_made", 1) + 1
        standby = Server(self, f"s{count - 1}", self.ports[count - 1])
        self.run("pg_basebackup", "-h", "127.0.0.1", "-p", primary.port, "-U", "postgres",
                 "-D", standby.data, "-R", "-X", "stream", "-c", "fast")
        standby.start()
        self.servers.append(standby)
        self.run("psql", "-h", "127.0.0.1", "-p", primary.port, "-U", "postgres", "-c",
                 "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.run("psql", "-h", "127.0.0.1", "-p", primary.port, "-U", "postgres", "-c",
                 "SELECT pg_reload_conf()")
        return standby

    @property
    def primary(self) -> Server:
        return self.servers[-2] if len(self.servers) > 1 else self.servers[-1]

    def in_sync(self) -> bool:
        """Does the primary have a synchronous standby streaming now?"""
        done = subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U",
             "postgres", "-Atc", "SELECT count(*) FROM pg_stat_replication "
             "WHERE sync_state = 'sync'", "postgres"], capture_output=True, text=True)
        return done.stdout.strip() == "1"

    def crash_primary(self) -> None:
        """The primary stops at once; its standby is not yet promoted (a failover manager
        takes a moment to decide)."""
        self.servers[-2].crash()

    def promote(self) -> Server:
        """Promote the standby of the crashed primary; returns the new primary."""
        self.servers.pop(-2)
        self.servers[-1].promote()
        return self.servers[-1]

    def url(self, database: str) -> str:
        """Every server, libpq choosing the one that takes writes (docs/operators.md, "A
        database that fails over")."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return (f"postgres://postgres@{hosts}/{database}"
                "?target_session_attrs=read-write&connect_timeout=3")

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)
