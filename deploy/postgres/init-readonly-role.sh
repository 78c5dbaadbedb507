#!/bin/sh
# Run by the postgres image when it creates the database (/docker-entrypoint-initdb.d):
# creates Grafana's read-only role from deploy/postgres/readonly-role.sql.
set -eu
: "${FARM_GRAFANA_DB_PASSWORD:?set FARM_GRAFANA_DB_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v grafana_password="$FARM_GRAFANA_DB_PASSWORD" \
    -f /etc/mtp-farm/postgres/readonly-role.sql
