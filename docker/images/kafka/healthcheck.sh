#!/bin/bash
# Healthy when the broker answers a request on its client listener: an ApiVersions request (v0,
# correlation id 1) and the first bytes of its answer within 5 s.
set -euo pipefail
exec 3<>"/dev/tcp/127.0.0.1/${KAFKA_PORT:-9092}"
printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff' >&3
# The answer's size and the correlation id: 1.
answer=$(timeout 5 head -c 8 <&3 | od -An -tx1 | tr -d ' \n')
[ "${answer:8:8}" = 00000001 ]
