#!/bin/bash
# Fresh inputs the agent never saw; the expected sums are computed here.
set -u
ok=1
for data in "hello" "$(seq 1 500)" ""; do
  printf '%s' "$data" > /tmp/in.bin
  want="$(od -An -v -tu1 /tmp/in.bin | tr -s ' ' '\n' | awk '{s+=$1} END {print s+0}')"
  got="$(/src/sum /tmp/in.bin 2>/dev/null)" || ok=0
  [ "$got" = "$want" ] || ok=0
done
echo "$ok" > /logs/verifier/reward.txt
