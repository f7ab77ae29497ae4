"""The walk of a request through the project's modules, against the layers of the import
contract (pyproject.toml): which modules it runs in, in order, and how often it climbs back
up: a call from code of a lower layer into code of a higher one (a callback, a generator, a
middleware calling the view, a helper a lower module imported from a page's module).

A module's layer is the first layer of the contract "workflows: entry points over services
over the engine over the models" that names it or a package holding it; the project's own
packages outside it are placed by what they are: `goals` beside the models, `tollgate`
(settings, middleware, helpers) below everything. Django, the
libraries and the templates' engine are not in the walk: what they call of the project is.
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


@dataclass
class Walk:
    """The modules a request ran in, consecutive repeats folded into one step."""

    modules: list[str] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (caller, callee) modules

    @property
    def climbs(self) -> list[tuple[str, str]]:
        """Each call from a module of a lower layer into one of a higher layer."""
        table = layers()
        return [(low, high) for low, high in self.calls
                if layer_of(high, table) < layer_of(low, table)]

    @property
    def revisits(self) -> int:
        """Steps into a module the walk had already left."""
        seen, count = set(), 0
        for module in self.modules:
            count += module in seen
            seen.add(module)
        return count


PROJECT = ("workflows", "goals", "tollgate")


def walk(call) -> tuple[object, Walk]:
    """Call `call()` and record the project modules it runs in, as calls and returns move
    between them; returns (its result, the walk)."""
    trail = Walk()

    def step(module: str) -> None:
        if not trail.modules or trail.modules[-1] != module:
            trail.modules.append(module)

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in PROJECT:
            return
        # Called from the nearest project frame below it (directly or through the framework).
        caller = frame.f_back
        while caller is not None and caller.f_globals.get(
                "__name__", "").split(".")[0] not in PROJECT:
            caller = caller.f_back
        if caller is not None:
            trail.calls.append((caller.f_globals.get("__name__", ""), module))
        step(module)

    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, trail
