#!/bin/bash
conf=/etc/app/app.conf
want="name = ledger
timezone = Europe/Berlin
workers = $(cat /work/WORKERS)
log = info"
if [ "$(cat "$conf" 2>/dev/null)" = "$want" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
