"""Run by Harbor's own interpreter (``.venv-harbor``, Python >= 3.12), never imported by DrumsBench.

Contract: ``python -I harbor_side.py`` reads a JSON list of task folder paths on stdin and prints one
JSON list on stdout, one entry per folder, in order: ``{"ok": true, "name", "instruction",
"has_steps", "config"}`` where ``config`` is Harbor's ``TaskConfig`` dumped as JSON, or ``{"ok":
false, "reason"}`` with Harbor's own reason for refusing the folder, on one line. Only the standard
library and ``harbor`` are imported: DrumsBench is not installed in that interpreter.
"""

import json
import sys
from pathlib import Path


def _reason(e: BaseException) -> str:
    """Harbor's refusal on one line: a pydantic error as ``field: message`` (the first one)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))
        except Exception:  # not pydantic's shape after all: fall back to the text
            pass
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def parse(folder: str) -> dict[str, object]:
    from harbor.models.task.task import Task

    try:
        task = Task(Path(folder))
    except Exception as e:  # Harbor refuses the folder: its reason is the answer
        return {"ok": False, "reason": _reason(e)}
    return {"ok": True, "name": task.name, "instruction": task.instruction, "has_steps": bool(task.has_steps),
            "config": task.config.model_dump(mode="json")}


def main() -> None:
    folders = json.load(sys.stdin)
    json.dump([parse(str(f)) for f in folders], sys.stdout)


if __name__ == "__main__":
    main()
