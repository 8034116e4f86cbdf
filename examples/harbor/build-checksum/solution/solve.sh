#!/bin/bash
cd /src
sed -i 's/unsigned long total = 0$/unsigned long total = 0;/' sum.c
gcc -O2 -o sum sum.c
