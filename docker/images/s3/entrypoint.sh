#!/bin/bash
# SeaweedFS (master, volume, filer and the S3 gateway in one process) on port 8333, then bucket
# `exactly` made (again on every start: it is kept when it exists). The bucket answering in
# `weed shell`'s list means the image is ready; the server's exit ends the container.
set -euo pipefail
data=/var/lib/seaweedfs/data
mkdir -p "$data"
weed server -dir="$data" -ip=127.0.0.1 -ip.bind=0.0.0.0 -volume.max=50 -master.volumeSizeLimitMB=64 \
  -master.telemetry=false -s3 -s3.port=8333 -s3.config=/etc/seaweedfs/s3.json &
server=$!
trap 'kill -TERM $server 2>/dev/null' TERM INT
for _ in $(seq 1 120); do
  if echo s3.bucket.list | weed shell -master=127.0.0.1:9333 2>/dev/null | grep -qw exactly; then
    echo "bucket exactly ready"
    break
  fi
  echo "s3.bucket.create -name exactly" | weed shell -master=127.0.0.1:9333 > /dev/null 2>&1 || true
  kill -0 $server 2>/dev/null || break
  sleep 1
done
wait $server
