"""Desktop verifier runner: one short-lived process inside the instance's mount and network namespaces.

Run as ``python3 runner.py <verify folder>`` under the system's Python (python3-uno lives in
``/usr/lib/python3/dist-packages``). It connects to LibreOffice over UNO on 127.0.0.1 inside the
instance's private network, prints ``DRUMSBENCH_READY`` once connected, finds the task's
document, calls the task's ``check(doc, ctx)`` from ``check.py`` (``ctx`` is this module: helpers
below; a check that reads only stored files sets ``FILE_ONLY = True`` and also runs after
the policy closed LibreOffice, with ``doc`` None — any other check then fails) and prints
``DRUMSBENCH_VERDICT <mac> {"passed": bool, "why": str}``. No READY line means the verifier could not
run (UNO not answering): the attempt is invalid, never a failure.

Both lines carry ``mac`` = HMAC-SHA256 of the text with a per-verification secret that the harness
writes on stdin (never argv, env or a file): nothing the policy reached during the episode can
print a line the harness accepts (docs/attribution.md).
"""

import importlib.util
import json
import os
import sys
import time
import zipfile
from typing import Any

from drumsbench.core.verdict_lines import ready_line, verdict_line  # its text, when shipped (verdict_channel)

sys.path.append("/usr/lib/python3/dist-packages")

UNO_URL = f"uno:{os.environ.get('DRUMSBENCH_UNO') or 'socket,host=127.0.0.1,port=2002'};urp;StarOffice.ComponentContext"
BOLD = 150.0  # com.sun.star.awt.FontWeight.BOLD

folder = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
if "--spec" in sys.argv:  # --identify, --capture: run as ``python3 -I -c <source>``, nothing staged
    spec = json.loads(sys.argv[sys.argv.index("--spec") + 1])
else:
    with open(os.path.join(folder, "task.json")) as _f:
        spec = json.load(_f)
work = spec["work"]


def app_exit() -> int | None:
    """LibreOffice's exit status when it has exited (0: closed by the policy), else None."""
    try:
        with open(spec.get("app_exit_file") or "/nonexistent") as f:
            return int(f.read().strip() or "-1")
    except (OSError, ValueError):
        return None


def connect(deadline_s: float = 10.0) -> Any:
    """The UNO desktop; None when LibreOffice turns out to have been closed normally meanwhile."""
    import uno  # only under the system Python

    local = uno.getComponentContext()
    resolver = local.ServiceManager.createInstanceWithContext("com.sun.star.bridge.UnoUrlResolver", local)
    end = time.monotonic() + deadline_s
    while True:
        try:
            ctx = resolver.resolve(UNO_URL)
            return ctx.ServiceManager.createInstanceWithContext("com.sun.star.frame.Desktop", ctx)
        except Exception:
            if app_exit() == 0:
                return None
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def documents(desktop: Any) -> list[Any]:
    out = []
    comps = desktop.getComponents().createEnumeration()
    while comps.hasMoreElements():
        c = comps.nextElement()
        if hasattr(c, "getURL"):
            out.append(c)
    return out


def find_by_place(desktop: Any) -> Any:
    """The open document whose file is the work folder's document itself, else one saved under
    another name directly in the work folder (Save As); a document of the same name anywhere else
    (a copy the policy stashed outside what the reset empties) is not the task's."""
    import uno  # only under the system Python

    folders = {uno.systemPathToFileUrl(p).rstrip("/") + "/" for p in (work, os.path.realpath(work))}
    name = uno.systemPathToFileUrl("/" + spec["document"])[len("file:///"):]
    docs = documents(desktop)
    for d in docs:
        if d.getURL() in {folder + name for folder in folders}:
            return d
    for d in docs:
        url = d.getURL()
        if any(url.startswith(folder) and "/" not in url[len(folder):] for folder in folders):
            return d
    return None


def find_document(desktop: Any) -> Any:
    """The task's document: the very document LibreOffice held when the attempt began, known by
    its ``RuntimeUID`` (``document_uid``: a number LibreOffice gives each document it opens, never
    twice in one process), wherever it has been saved since. A document opened during the attempt
    is never the task's — a solved copy stashed by an earlier attempt, saved over the task's file or
    not, nor the task's own file reopened. Without a recorded uid (an instance identified before
    this rule), the document is found by its place (``find_by_place``)."""
    want = spec.get("document_uid")
    if want is None:
        return find_by_place(desktop)
    for d in documents(desktop):
        if str(getattr(d, "RuntimeUID", "")) == want:
            return d
    return None


# -- helpers for check.py ------------------------------------------------------------------------
def paragraphs(doc: Any) -> list[Any]:
    """Writer: the body's paragraphs (tables skipped), as UNO objects."""
    out = []
    en = doc.getText().createEnumeration()
    while en.hasMoreElements():
        p = en.nextElement()
        if p.supportsService("com.sun.star.text.Paragraph"):
            out.append(p)
    return out


def texts(doc: Any) -> list[str]:
    return [p.getString() for p in paragraphs(doc)]


def portions(paragraph: Any) -> list[tuple[str, bool]]:
    """(text, bold) for each text portion of a paragraph."""
    out: list[tuple[str, bool]] = []
    en = paragraph.createEnumeration()
    while en.hasMoreElements():
        part = en.nextElement()
        out.append((part.getString(), float(part.CharWeight) >= BOLD))
    return out


def bold_words(paragraph: Any) -> list[str]:
    words: list[str] = []
    for text, bold in portions(paragraph):
        if bold:
            words += text.split()
    return words


def sheet(doc: Any, index: int = 0) -> Any:
    return doc.getSheets().getByIndex(index)


def cell(doc: Any, name: str, index: int = 0) -> Any:
    return sheet(doc, index).getCellRangeByName(name)


def column_strings(doc: Any, col: str, first: int, last: int, index: int = 0) -> list[str]:
    return [cell(doc, f"{col}{r}", index).getString() for r in range(first, last + 1)]


def stored_zip_text(name: str, member: str) -> str:
    """Text of ``member`` in the stored file ``name`` of the work folder ('' when absent)."""
    path = os.path.join(work, name)
    if not os.path.exists(path):
        return ""
    try:
        with zipfile.ZipFile(path) as z:
            return z.read(member).decode("utf-8", errors="replace")
    except (zipfile.BadZipFile, KeyError):
        return ""


def live_state(doc: Any) -> dict[str, Any]:
    """What a continuation of a branch must reproduce, beyond pixels (JSON values)."""
    ctrl = doc.getCurrentController()
    state: dict[str, Any] = {"modified": bool(doc.isModified())}
    try:
        state["undo"] = list(doc.getUndoManager().getAllUndoActionTitles())
    except Exception:
        state["undo"] = None
    if doc.supportsService("com.sun.star.text.TextDocument"):
        state["text"] = doc.getText().getString()
        vc = ctrl.getViewCursor()
        pos = vc.getPosition()
        state["cursor"] = [int(vc.getPage()), int(pos.X), int(pos.Y)]
        sel = ctrl.getSelection()
        state["selection"] = [sel.getByIndex(i).getString() for i in range(sel.getCount())] \
            if hasattr(sel, "getCount") else []
    elif doc.supportsService("com.sun.star.sheet.SpreadsheetDocument"):
        sheet = ctrl.getActiveSheet()
        cur = sheet.createCursor()
        cur.gotoEndOfUsedArea(False)
        end = cur.getRangeAddress()
        area = sheet.getCellRangeByPosition(0, 0, end.EndColumn, end.EndRow)
        state["text"] = [list(row) for row in area.getFormulaArray()]
        sel = ctrl.getSelection()
        if hasattr(sel, "getRangeAddress"):
            a = sel.getRangeAddress()
            state["selection"] = [a.Sheet, a.StartColumn, a.StartRow, a.EndColumn, a.EndRow]
        else:
            state["selection"] = None
        state["cursor"] = state["selection"][:3] if state["selection"] else None
    return state


def main() -> int:
    if "--identify" in sys.argv:  # at the start: the task's document's RuntimeUID (find_document)
        desktop = connect()
        doc = None if desktop is None else find_by_place(desktop)
        uid = None if doc is None else str(doc.RuntimeUID)
        print("DRUMSBENCH_IDENTITY " + json.dumps({"document_uid": uid}), flush=True)
        return 0
    if "--capture" in sys.argv:  # the live state for branching, not a verdict
        desktop = connect()
        doc = None if desktop is None else find_document(desktop)
        state = {"document": None} if doc is None else {"document": doc.getURL().rsplit("/", 1)[-1],
                                                         **live_state(doc)}
        print("DRUMSBENCH_CAPTURE " + json.dumps(state), flush=True)
        return 0
    secret = bytes.fromhex(sys.stdin.readline().strip())
    closed = "--office-closed" in sys.argv  # LibreOffice was closed by the policy: only stored files remain
    desktop = None if closed else connect()
    closed = closed or desktop is None
    print(ready_line(secret), flush=True)
    doc = None if desktop is None else find_document(desktop)
    module_spec = importlib.util.spec_from_file_location("check", os.path.join(folder, "check.py"))
    if module_spec is None or module_spec.loader is None:
        raise SystemExit("cannot load check.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if doc is None and not getattr(module, "FILE_ONLY", False):
        if closed:
            why = "no document is open (LibreOffice was closed)"
        elif spec.get("document_uid") is not None and (opened := documents(desktop)):
            why = ("no document is open that was open when the attempt began (closed; "
                   + ", ".join(d.getURL().rsplit("/", 1)[-1] or "untitled" for d in opened) + " opened since)")
        else:
            why = "no document is open"
        passed = False
    else:
        passed, why = module.check(doc, sys.modules[__name__])
    verdict = json.dumps({"passed": bool(passed), "why": str(why)[:300]})
    print(verdict_line(secret, verdict), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
