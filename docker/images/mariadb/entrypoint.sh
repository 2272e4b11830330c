#!/bin/sh
# Initialises the data directory on first start (the database and the user, before the server
# listens), then runs the server in the foreground. "ready for connections" in its log means it
# accepts clients.
set -eu
data=/var/lib/mysql
# Done once, marked when done: a first start that failed midway (its own marker says so) is done
# again from the beginning; a data directory this image did not make is never touched.
if [ ! -f "$data/.exactly-initialised" ]; then
  if [ -f "$data/.exactly-initialising" ]; then
    find "$data" -mindepth 1 -delete
  elif [ -n "$(ls -A "$data")" ]; then
    echo "$data holds data this image did not initialise: refusing to start on it" >&2
    exit 1
  fi
  touch "$data/.exactly-initialising"
  mariadb-install-db --no-defaults --datadir="$data" --auth-root-authentication-method=socket \
    --skip-test-db > /tmp/install.log 2>&1 || { cat /tmp/install.log >&2; exit 1; }
  # Bootstrap mode starts without grant tables; FLUSH PRIVILEGES loads them for CREATE USER.
  mariadbd --no-defaults --datadir="$data" --bootstrap --skip-networking <<SQL
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS exactly;
CREATE USER IF NOT EXISTS 'exactly'@'%' IDENTIFIED BY 'exactly';
GRANT ALL PRIVILEGES ON *.* TO 'exactly'@'%' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
  touch "$data/.exactly-initialised"
  rm -f "$data/.exactly-initialising"
fi
exec mariadbd --no-defaults --datadir="$data" --bind-address=0.0.0.0 --port=3306 \
  --socket=/run/mysqld/mysqld.sock --innodb-buffer-pool-size=256M --max-connections=500 \
  --skip-name-resolve --character-set-server=utf8mb4 --collation-server=utf8mb4_bin
