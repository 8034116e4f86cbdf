"""Canary scan: which tokens occur in the files below some folders.

Like ``fingerprint``, the function is shipped into sandboxes as source (``SCAN_SCRIPT``) so the
same code runs on the host and inside any substrate.

The tokens are secrets of the isolation gate: they must never appear on a host command line or in
a host file outside the sandbox (runc, for one, writes every exec's argv and environment to
``/tmp/runc-process*`` on the host, where the shared-places check would find them). So
``SCAN_SCRIPT`` reads its folders and tokens as JSON on **stdin** (``scan_request``) and prints the
*indices* of the tokens it found (``scan_hits`` maps them back), so not even its output carries one.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence


def scan_tokens(folders: list[str], tokens: list[str], max_file_bytes: int = 8 << 20) -> set[str]:
    """Tokens found in regular files (not followed links, at most ``max_file_bytes``) below ``folders``.

    Only regular files are opened, and never in a way that can block: a fifo, socket or device the
    sandbox's code left (or swapped in for a file meanwhile) is passed over — ``O_NONBLOCK`` and
    ``O_NOFOLLOW`` on the open, the type and size checked again on the open file, the read bounded
    (a fifo opened for reading would otherwise wait for a writer for ever: the gate of a run whose
    code under test made one never ended)."""
    import os
    import stat

    wanted = [t.encode() for t in tokens if t]
    hits: set[str] = set()
    for top in folders:
        for dirpath, _dirnames, filenames in os.walk(top):
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode) or st.st_size > max_file_bytes:
                        continue
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with open(fd, "rb") as f:
                        st = os.fstat(fd)
                        if not stat.S_ISREG(st.st_mode) or st.st_size > max_file_bytes:
                            continue
                        data = f.read(max_file_bytes)
                except OSError:
                    continue
                hits.update(t.decode() for t in wanted if t in data)
    return hits


SCAN_SCRIPT = (
    "import json, sys\n\n"
    + inspect.getsource(scan_tokens)
    + "\n_req = json.loads(sys.stdin.buffer.read())\n"
    "_hits = scan_tokens(_req['folders'], _req['tokens'])\n"
    "print(','.join(str(i) for i, t in enumerate(_req['tokens']) if t in _hits))\n"
)


def scan_request(folders: Sequence[str], tokens: Sequence[str]) -> bytes:
    """``SCAN_SCRIPT``'s stdin."""
    return json.dumps({"folders": list(folders), "tokens": list(tokens)}).encode()


def scan_hits(output: str, tokens: Sequence[str]) -> set[str]:
    """The tokens ``SCAN_SCRIPT``'s output names (by index)."""
    hits = set()
    for part in output.strip().split(","):
        if part.strip().isdigit() and int(part) < len(tokens):
            hits.add(tokens[int(part)])
    return hits
