#!/bin/bash
# The reward: 1 when count.txt holds the word count of notes.txt (computed here, not trusted).
want="$(wc -w < /app/notes.txt | tr -d ' ')"
if [ -f /app/count.txt ] && [ "$(cat /app/count.txt)" = "$want" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
