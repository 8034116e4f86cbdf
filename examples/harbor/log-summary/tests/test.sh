#!/bin/bash
# The expected summary, written here: the level is the second field (the last line's message
# mentions ERROR but is INFO).
want='db 3
api 2
cache 1
worker 1'
if [ "$(cat /srv/logs/errors.txt 2>/dev/null)" = "$want" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
