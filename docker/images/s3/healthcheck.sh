#!/bin/bash
# Healthy when bucket `exactly` is listed and a write is stored (listing works before the server
# gives out volumes for writes): a small file PUT through the filer (port 8888), 201 Created.
set -euo pipefail
echo s3.bucket.list | weed shell -master=127.0.0.1:9333 2>/dev/null | grep -qw exactly
exec 3<>/dev/tcp/127.0.0.1/8888
printf 'PUT /exactly-probe/ready HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\nok' >&3
status=$(timeout 10 head -n 1 <&3)
[[ $status == *" 201 "* ]]
