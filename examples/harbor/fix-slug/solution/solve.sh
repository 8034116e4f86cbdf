#!/bin/bash
cat > /app/slug.py <<'PY'
import re


def slug(title):
    """A URL slug of ``title``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
PY
