#!/usr/bin/env bash
# Start the machine's PostgreSQL when it is not accepting connections (tests need it).
set -euo pipefail
if pg_isready -q -h 127.0.0.1 -p 5432; then exit 0; fi
version=$(ls /etc/postgresql | sort -V | tail -1)
pg_ctlcluster --skip-systemctl-redirect "$version" main start
for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done
echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1
