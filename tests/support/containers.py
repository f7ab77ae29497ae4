"""Podman for the container tests: the image built once per test session on the offline
base (scripts/container-base), containers on the host's network against the test's own
PostgreSQL database and Redis queue, and every container and volume removed afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

from .processes import ROOT

CONF = ROOT / "deploy" / "podman" / "containers.conf"
BASE = "localhost/tollgate-base:trixie"
# Where HTTPS to the package registries passes a proxy, pip in the build needs its roots.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def podman(*args: str, check: bool = True, timeout: float = 300, stdin: str | None = None
           ) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], env={**os.environ, "CONTAINERS_CONF": str(CONF)},
                          capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:4])} ... exited {proc.returncode}:\n"
                             f"{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return proc


def build(tag: str, context: Path = ROOT) -> str:
    """Build the Containerfile in `context` on the offline base; the tag."""
    subprocess.run([str(ROOT / "scripts" / "container-base")], check=True, timeout=900,
                   env={**os.environ, "CONTAINERS_CONF": str(CONF)}, capture_output=True)
    mounts = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.exists() else []
    podman("build", "--format", "docker", "--network=host", *mounts, "--build-arg",
           f"BASE={BASE}", "-t", tag, "-f", str(context / "Containerfile"), str(context),
           timeout=1500)
    return tag


class Stack:
    """Containers of one test: named apart, on the host's network, sharing one data volume
    (the spool, metrics and secret key, as compose.yaml shares it), with `env` given to
    each; `close()` removes them all."""

    def __init__(self, image: str, env: dict[str, str]):
        self.image, self.env = image, env
        self.prefix = f"tg-{uuid.uuid4().hex[:8]}"
        self.volume = f"{self.prefix}-data"
        self.names: list[str] = []

    def _env(self, extra: dict[str, str]) -> list[str]:
        return [arg for key, value in {**self.env, **extra}.items()
                for arg in ("-e", f"{key}={value}")]

    def run(self, *command: str, image: str = "", volume: str = "", **extra: str) -> str:
        """A one-shot container (the migration, a management command): its output."""
        return podman("run", "--rm", "--network=host", "--read-only", "--tmpfs", "/tmp",
                      "-v", f"{volume or self.volume}:/data", *self._env(extra),
                      image or self.image, *command, timeout=300).stdout

    def start(self, role: str, *command: str, image: str = "", user: str = "",
              volume: str = "", mounts: tuple[str, ...] = (), **extra: str) -> str:
        """A long-running container; its name."""
        name = f"{self.prefix}-{role}"
        self.names.append(name)
        podman("run", "-d", "--name", name, "--network=host", "--read-only", "--tmpfs",
               "/tmp", "-v", f"{volume or self.volume}:/data",
               *[arg for mount in mounts for arg in ("-v", mount)],
               *(["--user", user] if user else []), *self._env(extra),
               image or self.image, *command)
        return name

    def kill(self, name: str) -> None:
        podman("kill", name)

    def stop(self, name: str, seconds: int = 30) -> None:
        podman("stop", "-t", str(seconds), name, timeout=seconds + 60)

    def logs(self, name: str) -> str:
        return podman("logs", name, check=False).stderr[-4000:]

    def inspect(self, name: str) -> dict:
        return json.loads(podman("inspect", name).stdout)[0]

    def close(self) -> None:
        for name in self.names:
            podman("rm", "-f", "-t", "0", name, check=False)
        podman("volume", "rm", "-f", self.volume, check=False)
