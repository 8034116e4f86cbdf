"""What every command shares: the console, progress, and turning bad input into a usage error.

Every user error is a ``UsageError``: one line on stderr naming the flag and the fix, exit code 2,
no traceback (``drumsbench.cli.main`` prints it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.console import Console
from rich.live import Live

from drumsbench.core.errors import UsageError

if TYPE_CHECKING:
    from drumsbench.ledger import Ledger
    from drumsbench.rollout.attempt import RolloutConfig
    from drumsbench.substrates.base import Substrate

console = Console()
if not console.is_terminal and not os.environ.get("COLUMNS"):
    console = Console(width=160)  # files and pipes: wide enough for the tables (no cells cut at 80 columns)
err = Console(stderr=True)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, field: str) -> float:
    """'90', '90s', '15m', '1h', '500ms' -> seconds; UsageError naming ``field`` otherwise."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", text or "")
    if not m:
        raise UsageError(f"{field}: {text!r} is not a duration; write e.g. 60s, 15m, 1h or 500ms")
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if value <= 0:
        raise UsageError(f"{field}: {text!r} must be positive; write e.g. 60s")
    return value


def duration_or_none(text: str | None, field: str) -> float | None:
    """A duration, or None for 'none', 'off', '0' or nothing."""
    if text is None or text.strip().lower() in ("", "0", "0s", "none", "off"):
        return None
    return parse_duration(text, field)


def parse_int_list(text: str, field: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; UsageError naming ``field`` otherwise."""
    parts = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not parts:
        raise UsageError(f"{field}: give a comma-separated list of integers, e.g. 1,2,4,8")
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            raise UsageError(f"{field}: {p!r} is not an integer; write e.g. 1,2,4,8") from None
    return out


def names(*values: Iterable[str] | str | None) -> list[str]:
    """Names given repeatedly and/or comma-separated (``--substrate a --substrate b,c``), in order."""
    out: list[str] = []
    for v in values:
        for item in [v] if isinstance(v, str) else v or []:
            out += [n.strip() for n in item.split(",") if n.strip()]
    return out


def substrate_names(given: list[str] | None, alias: list[str] | None = None,
                    default: str = "process") -> list[str]:
    """The substrates of ``--substrate`` (repeatable, comma lists) and its hidden alias ``--substrates``."""
    if not given and not alias:
        return [default]
    out = names(given, alias)
    if not out:
        raise UsageError("--substrate: give at least one substrate, e.g. --substrate process,docker")
    return out


def one_suite(tasks: str, alias: str | None) -> str:
    """``--tasks``, or its hidden alias ``--env`` (the older name on ``branch``) when that is given."""
    return alias if alias is not None else tasks


def parse_reset(reset: str) -> str | None:
    """``--reset``: auto (None: the substrate's own), in_place, recreate or restore (the desktop)."""
    if reset not in ("auto", "in_place", "recreate", "restore"):
        raise UsageError(f"--reset: {reset!r} is not one of auto, in_place, recreate, restore")
    return None if reset == "auto" else reset


def rollout_config(step_timeout: str, episode_timeout: str, think_time: str = "0s", reset: str | None = None,
                   verify_timeout: str = "task") -> RolloutConfig:
    """The rollout limits of ``--step-timeout``, ``--episode-timeout``, ``--think-time``, ``--reset``
    (already checked by ``parse_reset``) and ``--verify-timeout`` ('task': each task's own)."""
    from drumsbench.rollout.attempt import RolloutConfig
    from drumsbench.substrates.base import ResetStrategy

    return RolloutConfig(
        step_timeout_s=parse_duration(step_timeout, "--step-timeout"),
        episode_timeout_s=parse_duration(episode_timeout, "--episode-timeout"),
        think_time_s=0.0 if think_time.strip() in ("0", "0s") else parse_duration(think_time, "--think-time"),
        reset=None if reset is None else "restore" if reset == "restore" else ResetStrategy(reset),
        verify_timeout_s=None if verify_timeout == "task" else parse_duration(verify_timeout, "--verify-timeout"))


def usage_error(e: ValidationError, flags: dict[str, str] | None = None) -> UsageError:
    """A one-line usage error from a configuration model's first validation error: the field's
    flag (from ``flags``, else ``--field-name`` without a ``_s`` unit suffix) and pydantic's message."""
    first = e.errors()[0]
    name = str(first["loc"][-1]) if first["loc"] else "?"
    flag = (flags or {}).get(name) or "--" + name.removesuffix("_s").replace("_", "-")
    return UsageError(f"{flag}: {first['msg']}")


@contextlib.contextmanager
def progress_lines(progress: bool) -> Iterator[Callable[[str], None]]:
    """What a long command says as it goes: on a terminal a live status line (rich) with each step
    also printed; into a pipe plain lines on stderr; nothing with ``--no-progress``."""
    if not progress:
        yield lambda _m: None
        return
    if not err.is_terminal:
        yield lambda m: err.print(m)
        return
    with err.status("starting") as status:
        def say(m: str) -> None:
            err.print(m)
            status.update(m)

        yield say


@contextlib.contextmanager
def finishing(ledger: Ledger, run_id: str, subs: list[Substrate]) -> Iterator[None]:
    """Around a command's work on its substrates: the run is marked complete when the work returns,
    and every substrate is closed however it ends."""
    try:
        yield
        ledger.set_status(run_id, "complete")
    finally:
        for sub in subs:
            sub.close()


def live(progress: bool) -> Live | None:
    """A live display on stderr for a terminal with progress on; None otherwise (not started)."""
    return Live(console=err, refresh_per_second=4, transient=True) if progress and err.is_terminal else None


def write_json(data: dict[str, Any], folder: Path | None, name: str, json_path: Path | None) -> None:
    """A report's JSON into ``folder/name`` (none: no folder copy) and to ``--json`` if given."""
    text = json.dumps(data, indent=2)
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
        except OSError as e:  # e.g. a full disk: the ledger holds everything, the report can be rebuilt
            raise UsageError(f"--out: cannot write {folder / name} ({e.strerror}); make room, then rebuild it with "
                             f"`drumsbench report {folder.name} --out {folder.parent}`") from None
    if json_path is not None:
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(text)
        except OSError as e:
            raise UsageError(f"--json: cannot write {json_path} ({e.strerror}); choose a writable path") from None
