#!/bin/sh
# Initialises the data directory on first start (the database and the user, before the server
# listens), then runs the server in the foreground. "ready for connections" in its log means it
# accepts clients.
set -eu
data=/var/lib/mysql
if [ ! -d "$data/mysql" ]; then
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
fi
exec mariadbd --no-defaults --datadir="$data" --bind-address=0.0.0.0 --port=3306 \
  --socket=/run/mysqld/mysqld.sock --innodb-buffer-pool-size=256M --max-connections=500 \
  --skip-name-resolve --character-set-server=utf8mb4 --collation-server=utf8mb4_bin
