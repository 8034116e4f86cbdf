"""The same names for the same things on every command: one set of shared options (cli/options.py),
--substrate repeatable and comma-separated wherever a command takes several, --tasks for a suite,
the older names (--substrates, --env) still accepted but hidden."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from drumsbench.cli import app
from drumsbench.cli.common import names, substrate_names
from drumsbench.core.errors import UsageError

from helpers import cli


def _commands() -> dict[str, Any]:
    """Every command by its name (``tasks check``); typer's own click objects, read by their fields."""
    root: Any = typer.main.get_command(app)
    out: dict[str, Any] = {}
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            out.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
        else:
            out[name] = cmd
    return out


COMMANDS = _commands()


def _options(cmd: Any) -> dict[str, Any]:
    return {o: p for p in cmd.params if p.param_type_name == "option" for o in p.opts}


def test_every_command_is_registered():
    assert set(COMMANDS) >= {"run", "report", "gc", "doctor", "conformance", "sweep", "project", "branch", "serve",
                             "coldstart", "isolation", "train", "tasks list", "tasks fingerprint", "tasks check",
                             "tasks make"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_one_name_per_thing(name):
    opts = _options(COMMANDS[name])
    for old, new in (("--substrates", "--substrate"), ("--env", "--tasks")):
        if old in opts:  # an older name: hidden, beside the one shown
            assert opts[old].hidden and new in opts and not opts[new].hidden, (name, old)
    if "--substrates" in opts:
        assert opts["--substrate"].multiple and opts["--substrates"].multiple, name
    for flag in ("--out", "--json", "--progress", "--price", "--concurrency", "--step-timeout"):
        if flag in opts:
            assert len(opts[flag].opts) == 1, (name, flag)
    shown = {o for o, p in opts.items() if not p.hidden}
    assert not shown & {"--env", "--substrates", "--suite"}, (name, shown)


def test_shared_options_have_one_help_text():
    helps: dict[str, set[str]] = {}
    for cmd in COMMANDS.values():
        for flag, p in _options(cmd).items():
            helps.setdefault(flag, set()).add(p.help or "")
    for flag in ("--out", "--progress", "--price", "--step-timeout", "--episode-timeout", "--verify-timeout"):
        assert len(helps[flag]) == 1, (flag, helps[flag])


def test_substrates_commands_take_a_repeatable_comma_list():
    several = [n for n, c in COMMANDS.items() if "--substrate" in _options(c) and _options(c)["--substrate"].multiple]
    assert set(several) >= {"coldstart", "isolation", "project", "tasks check"}
    assert names(["process,docker", "bwrap"], ["vm"]) == ["process", "docker", "bwrap", "vm"]
    assert substrate_names(None, None) == ["process"]
    assert substrate_names(["process, docker"], None) == ["process", "docker"]
    with pytest.raises(UsageError, match=r"^--substrate: "):
        substrate_names([","], None)


@pytest.mark.parametrize("args", [
    ["coldstart", "--substrate", "process,nosuch", "-n", "1"],
    ["coldstart", "--substrate", "process", "--substrate", "nosuch", "-n", "1"],
    ["isolation", "--substrates", "nosuch"],
    ["project", "--substrate", "process,nosuch"],
])
def test_a_bad_substrate_in_a_list_is_one_line_naming_the_flag(args, tmp_path):
    proc = cli(*args, "--out", str(tmp_path / "runs"), "--no-progress",
               env={"DRUMSBENCH_STATE": str(tmp_path / "state")})
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --substrate") and "nosuch" in lines[0], lines
