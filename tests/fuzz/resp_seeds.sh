#!/usr/bin/env bash
# Seeds for fuzz_resp_reader: replies a Redis Cluster sends the remote tier (the first byte of
# each file picks the fuzzer's chunk size).
set -euo pipefail
out=$1
mkdir -p "$out"
big=$(head -c 200 /dev/zero | tr '\0' 'v')
printf '\x07+OK\r\n:42\r\n$-1\r\n' > "$out/simple"
printf '\x01-MOVED 3999 127.0.0.1:7001\r\n-ASK 12 127.0.0.1:7002\r\n' > "$out/redirects"
printf '\x10$200\r\n%s\r\n$3\r\nabc\r\n' "$big" > "$out/large"
printf '\x03*2\r\n*3\r\n:0\r\n:5460\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n*3\r\n:5461\r\n:16383\r\n*2\r\n$0\r\n\r\n:7001\r\n' > "$out/slots"
