#!/bin/sh
# Initialises the data directory on first start (the cluster, the user and the database, before
# the server listens), then runs the server in the foreground. "ready to accept connections" in
# its log means it accepts clients.
set -eu
# The volume's directory holds the markers and the cluster, in a subdirectory (initdb wants one
# of its own, empty).
top=/var/lib/postgresql/data
data=$top/cluster
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
# Done once, marked when done: a first start that failed midway (its own marker says so) is done
# again from the beginning; a data directory this image did not make is never touched.
if [ ! -f "$top/.exactly-initialised" ]; then
  if [ -f "$top/.exactly-initialising" ]; then
    find "$top" -mindepth 1 -delete
  elif [ -n "$(ls -A "$top")" ]; then
    echo "$top holds data this image did not initialise: refusing to start on it" >&2
    exit 1
  fi
  touch "$top/.exactly-initialising"
  "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 -E UTF8 \
    --locale=C.UTF-8 > /tmp/initdb.log 2>&1 || { cat /tmp/initdb.log >&2; exit 1; }
  printf '%s\n' 'local all all trust' 'host all all all scram-sha-256' > "$data/pg_hba.conf"
  # The user and the database over the Unix socket of a server that listens on nothing else;
  # an error stops the start here, before the marker (the next start begins again).
  "$bin/pg_ctl" -D "$data" -o "-c listen_addresses='' -k /run/postgresql" -w -s start > /tmp/init-start.log 2>&1 ||
    { cat /tmp/init-start.log >&2; exit 1; }
  psql -X -q -v ON_ERROR_STOP=1 -h /run/postgresql -U postgres -d postgres <<SQL
CREATE USER exactly WITH PASSWORD 'exactly' SUPERUSER REPLICATION;
CREATE DATABASE exactly OWNER exactly;
SQL
  "$bin/pg_ctl" -D "$data" -m fast -w -s stop
  touch "$top/.exactly-initialised"
  rm -f "$top/.exactly-initialising"
fi
exec "$bin/postgres" -D "$data" -c listen_addresses='*' -p 5432 -k /run/postgresql \
  -c max_prepared_transactions=200 -c max_connections=300 -c wal_level=logical \
  -c max_replication_slots=20 -c max_wal_senders=20
