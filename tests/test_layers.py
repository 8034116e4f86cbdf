"""The layers import one way only (docs/design.md): walking every import of the package (lazy ones
inside functions included) finds no arrow from a lower layer to a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "drumsbench"

# layer -> layers it must never import (directly or lazily)
UPWARD = {
    "core": {"ledger", "measure", "report", "experiments", "executors", "rollout", "envs", "substrates", "policies",
             "branching", "train", "serve", "cli", "gym", "images"},
    "report": {"experiments", "executors", "rollout", "envs", "substrates", "policies", "branching", "train",
               "serve", "cli"},
    "measure": {"experiments", "executors", "rollout", "envs", "substrates", "policies", "branching", "train",
                "serve", "report", "cli"},
    "ledger": {"measure", "report", "experiments", "executors", "rollout", "envs", "substrates", "policies"},
    "substrates": {"envs", "rollout", "policies", "branching", "experiments", "executors", "measure", "report",
                   "train", "serve"},
    "envs": {"branching", "experiments", "executors", "rollout", "report", "measure", "train", "serve", "cli",
             "policies", "taskgen"},
    # task making (``tasks make``): reads projects, writes task folders, runs suites in a sandbox
    "taskgen": {"rollout", "experiments", "executors", "report", "branching", "train", "serve", "cli", "policies",
                "measure", "ledger"},
    "policies": {"rollout", "experiments", "executors", "report", "branching", "train", "serve", "substrates"},
    "rollout": {"experiments", "executors", "report", "branching", "train", "serve", "cli"},
    "branching": {"experiments", "executors", "report", "train", "serve", "cli"},
    "executors": {"experiments", "report", "train", "serve", "cli"},
    "experiments": {"report", "cli"},
}
# an environment reaches substrates only through their interface
ENV_MAY_IMPORT_FROM_SUBSTRATES = {"drumsbench.substrates.base"}
# known exceptions (none left: the desktop reaches its sandbox through HostFolders and HostLaunching)
KNOWN: set[tuple[str, str]] = set()


def _imports() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC)
        if rel.parts[0] == "tasks":  # task suites are data
            continue
        mod = ".".join(("drumsbench", *rel.with_suffix("").parts)).removesuffix(".__init__")
        found: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("drumsbench"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)  # `from drumsbench import x`
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("drumsbench"))
        out[mod] = found
    return out


def _known(module: str, target: str) -> bool:
    return any(module == m and (target == t or target.startswith(t + ".")) for m, t in KNOWN)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


IMPORTS = _imports()


def test_the_walk_sees_the_package():
    assert len(IMPORTS) > 80 and "drumsbench.report.html" in IMPORTS
    assert "drumsbench.measure.artifacts" in IMPORTS["drumsbench.report.html.data"]


@pytest.mark.parametrize("layer", sorted(UPWARD))
def test_no_upward_import(layer):
    bad = sorted((m, t) for m, targets in IMPORTS.items() if _layer(m) == layer
                 for t in targets if _layer(t) in UPWARD[layer] and not _known(m, t))
    assert not bad, f"{layer} imports a higher layer: {bad}"


def test_only_the_command_line_imports_the_command_line():
    """``cli/`` is the top: it calls experiments and report; nothing below it reaches back."""
    bad = sorted((m, t) for m, targets in IMPORTS.items() if _layer(m) not in ("cli", "__main__")
                 for t in targets if _layer(t) == "cli")
    assert not bad, bad


def test_environments_use_the_substrate_interface_only():
    bad = sorted((m, t) for m, targets in IMPORTS.items() if _layer(m) == "envs"
                 for t in targets if _layer(t) == "substrates" and t not in ENV_MAY_IMPORT_FROM_SUBSTRATES
                 and not t.startswith("drumsbench.substrates.base.") and not _known(m, t))
    assert not bad, bad


def test_the_known_exception_is_still_real():
    """When the desktop no longer needs the process substrate, this fails: drop the exception."""
    for m, t in KNOWN:
        assert t in IMPORTS[m], f"{m} no longer imports {t}: remove it from KNOWN"


def test_an_environment_never_narrows_its_task_itself():
    """``Environment`` is generic over its task type (``Environment[CodingTask]``): a kind's methods
    take their own task type, so no environment class asserts ``isinstance(task, ...)``."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Assert) and isinstance(node.test, ast.Call)
                    and isinstance(node.test.func, ast.Name) and node.test.func.id == "isinstance"
                    and node.test.args and isinstance(node.test.args[0], ast.Name) and node.test.args[0].id == "task"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def test_the_suite_registry_imports_no_kind():
    """``envs/suites.py`` reaches a kind only through its registry entry (``EnvKind``'s strings)."""
    bad = sorted(t for t in IMPORTS["drumsbench.envs.suites"]
                 if t.startswith(("drumsbench.envs.coding", "drumsbench.envs.desktop")))
    assert not bad, bad


CONCRETE_SUBSTRATES = ("process", "bwrap", "overlay", "containers", "vm")  # (hostproc, exec_core: shared helpers)
# experiments/chaos.py drives the engines themselves (kill a container, its daemon); its podman
# calls need the podman substrate's private configuration (``podman_cli``)
EXPERIMENTS_KNOWN = {("drumsbench.experiments.chaos", "drumsbench.substrates.containers.podman_cli")}


def test_experiments_never_import_a_concrete_substrate():
    found = {(m, t) for m, targets in IMPORTS.items() if _layer(m) == "experiments" for t in targets
             if t.startswith(tuple(f"drumsbench.substrates.{s}" for s in CONCRETE_SUBSTRATES))}
    bad = sorted((m, t) for m, t in found
                 if not any(m == km and (t == kt or t.startswith(kt + ".")) for km, kt in EXPERIMENTS_KNOWN))
    assert not bad, bad
    stale = sorted(k for k in EXPERIMENTS_KNOWN if not any(m == k[0] and t.startswith(k[1]) for m, t in found))
    assert not stale, f"no longer imported, drop from EXPERIMENTS_KNOWN: {stale}"
