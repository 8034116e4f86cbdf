#!/bin/bash
set -e
cd /build
gcc -O2 -o greet greet.c
install -m 755 greet /opt/svc/bin/greet
echo "greeting = hello" > /opt/svc/etc/greet.conf
