#!/bin/bash
cd /repo || { echo 0 > /logs/verifier/reward.txt; exit 0; }
ok=1
[ "$(git rev-list --count HEAD 2>/dev/null)" = 4 ] || ok=0
[ "$(git log --format=%s HEAD~1 -1 2>/dev/null)" = "raise the retry limit" ] || ok=0
[ "$(git show HEAD:settings.ini 2>/dev/null)" = "$(printf 'retries = 3\ntimeout = 30')" ] || ok=0
[ -z "$(git status --porcelain 2>/dev/null)" ] || ok=0
echo "$ok" > /logs/verifier/reward.txt
