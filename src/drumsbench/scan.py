"""Canary scan: which tokens occur in the files below some folders.

Like ``fingerprint``, the function is shipped into sandboxes as source (``SCAN_SCRIPT``) so the
same code runs on the host and inside any substrate.
"""

from __future__ import annotations

import inspect


def scan_tokens(folders: list[str], tokens: list[str], max_file_bytes: int = 8 << 20) -> set[str]:
    """Tokens found in regular files (not followed links, at most ``max_file_bytes``) below ``folders``."""
    import os

    wanted = [t.encode() for t in tokens if t]
    hits: set[str] = set()
    for top in folders:
        for dirpath, _dirnames, filenames in os.walk(top):
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    if os.path.islink(path) or os.path.getsize(path) > max_file_bytes:
                        continue
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                hits.update(t.decode() for t in wanted if t in data)
    return hits


SCAN_SCRIPT = (
    "import sys\n\n"
    + inspect.getsource(scan_tokens)
    + "\nprint(','.join(sorted(scan_tokens(sys.argv[1].split(','), sys.argv[2].split(',')))))\n"
)
