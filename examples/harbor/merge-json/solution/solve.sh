#!/bin/bash
python3 - <<'PY'
import json


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


with open("/data/base.json") as f, open("/data/override.json") as g:
    merged = merge(json.load(f), json.load(g))
with open("/data/merged.json", "w") as f:
    json.dump(merged, f, indent=2)
PY
