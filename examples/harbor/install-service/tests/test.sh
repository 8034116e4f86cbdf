#!/bin/bash
# Runs the installed program on its own configuration and on a fresh one written here.
ok=1
[ "$(stat -c %a /opt/svc/bin/greet 2>/dev/null)" = 755 ] || ok=0
[ "$(cat /opt/svc/etc/greet.conf 2>/dev/null)" = "greeting = hello" ] || ok=0
[ "$(/opt/svc/bin/greet /opt/svc/etc/greet.conf 2>/dev/null)" = hello ] || ok=0
printf 'greeting = salut\n' > /tmp/other.conf
[ "$(/opt/svc/bin/greet /tmp/other.conf 2>/dev/null)" = salut ] || ok=0
echo "$ok" > /logs/verifier/reward.txt
