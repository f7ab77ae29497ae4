"""The walk of a request through the project's modules, against the layers of the import
contract (pyproject.toml): how often it climbs back up, a call from code of a lower layer
into code of a higher one (a callback, a generator, a middleware calling the view, a helper
a lower module imported from a page's module).

A module's layer is the first layer of the contract "workflows: entry points over services
over the engine over the models" that names it or a package holding it; the project's own
packages outside it are placed by what they are: `goals` beside the models, `tollgate`
(settings, middleware, helpers) below everything. Django, the libraries and the templates'
engine are not in the walk: what they call of the project is.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "workflows: entry points over services over the engine over the models"


def layers() -> list[list[str]]:
    """The contract's layers, highest first, each a list of module names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["name"] == CONTRACT:
            return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]
    raise LookupError(f"no contract named {CONTRACT!r} in pyproject.toml")


def layer_of(module: str, table: list[list[str]]) -> int:
    """The index of the module's layer (0 is the top)."""
    if module.split(".")[0] == "goals":
        module = "workflows.models"
    for index, names in enumerate(table):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    return len(table)  # tollgate's helpers, and anything placed nowhere: the floor


def project(frame) -> str:
    """The module a frame runs in when it is the project's, else ""."""
    module = frame.f_globals.get("__name__", "")
    return module if module.split(".")[0] in PROJECT else ""


PROJECT = ("workflows", "goals", "tollgate")


@dataclass
class Walk:
    """The calls a request made from one project module into another."""

    calls: list[tuple[str, str]] = field(default_factory=list)  # (caller, callee) modules

    @property
    def climbs(self) -> list[tuple[str, str]]:
        """Each call from a module of a lower layer into one of a higher layer."""
        table = layers()
        return [(low, high) for low, high in self.calls
                if layer_of(high, table) < layer_of(low, table)]


def walk(call) -> tuple[object, Walk]:
    """Call `call()` and record each call into the project's code with the project module
    it came from; returns (its result, the walk)."""
    trail = Walk()

    def profile(frame, event, arg):
        if event != "call" or not (module := project(frame)):
            return
        # Called from the nearest project frame below it (directly or through the framework).
        caller = frame.f_back
        while caller is not None and not project(caller):
            caller = caller.f_back
        if caller is not None:
            trail.calls.append((project(caller), module))

    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, trail
