#!/bin/bash
n="$(cat /work/WORKERS)"
sed -i -e 's/^timezone = .*/timezone = Europe\/Berlin/' -e "s/^workers = .*/workers = $n/" /etc/app/app.conf
