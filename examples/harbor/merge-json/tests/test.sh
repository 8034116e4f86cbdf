#!/bin/bash
# The expected result is computed here from the original inputs, not read from the agent's files.
python3 - <<'PY'
import json

base = {"name": "ledger", "limits": {"cpu": 2, "memory": 512, "disk": {"size": 10, "kind": "ssd"}}, "tags": ["a"]}
override = {"limits": {"memory": 1024, "disk": {"size": 20}}, "tags": ["b"], "owner": "ops"}


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


ok = 0
try:
    with open("/data/merged.json") as f:
        got = json.load(f)
    with open("/data/base.json") as f, open("/data/override.json") as g:
        unchanged = json.load(f) == base and json.load(g) == override
    ok = int(got == merge(base, override) and unchanged)
except (OSError, ValueError):
    pass
with open("/logs/verifier/reward.txt", "w") as f:
    f.write(f"{ok}\n")
PY
