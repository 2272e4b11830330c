#!/usr/bin/env python3
"""Exit 0 when a Kafka broker at HOST:PORT answers a Metadata request listing at least one broker.

Used by scripts/services to wait for the broker; speaks the wire protocol directly so the check
needs nothing but Python (Metadata v1: api_key 3, topics = null means "all topics").
"""
import socket
import struct
import sys


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> int:
    client_id = b"exactly-ready"
    body = struct.pack(">hhih", 3, 1, 1, len(client_id)) + client_id + struct.pack(">i", -1)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        header = _read_exact(sock, 4)
        (size,) = struct.unpack(">i", header)
        payload = _read_exact(sock, size)
    # correlation id (4 bytes), then the brokers array: int32 count.
    (_, brokers) = struct.unpack(">ii", payload[:8])
    return brokers


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return buf


if __name__ == "__main__":
    host, port = sys.argv[1].rsplit(":", 1)
    try:
        sys.exit(0 if metadata_brokers(host, int(port)) > 0 else 1)
    except OSError as err:
        print(f"not ready: {err}", file=sys.stderr)
        sys.exit(1)
