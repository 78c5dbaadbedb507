-- The role Grafana reads the farm's store with: it may read every table, nothing else.
--
-- Run once per store, as the store's owner (the user `farm db upgrade` runs as) if it
-- may create roles, else as an administrator naming the owner with -v owner=...;
-- running it again only resets the password:
--
--     psql "$FARM_DB_URL" -v grafana_password="$FARM_GRAFANA_DB_PASSWORD" \
--          -f deploy/postgres/readonly-role.sql
--     psql -U postgres -d farm -v owner=farm -v grafana_password=... -f ...
--
-- deploy/docker-compose.yaml runs it when it creates the database
-- (deploy/postgres/init-readonly-role.sh). Grafana then connects as farm_grafana
-- (FARM_DB_USER / FARM_DB_PASSWORD in Grafana's environment), never as the owner, so a
-- dashboard query - or anyone holding Grafana's data source password - cannot change
-- or delete results.

\set ON_ERROR_STOP on
\if :{?grafana_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'no password: psql -v grafana_password=... -f readonly-role.sql'; END $$;
\endif
\if :{?owner}
\else
  \set owner :USER
\endif

-- No SUPERUSER, CREATEDB or CREATEROLE: the defaults of CREATE ROLE.
SELECT 'CREATE ROLE farm_grafana LOGIN NOINHERIT'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'farm_grafana')
\gexec

ALTER ROLE farm_grafana WITH LOGIN PASSWORD :'grafana_password';
-- Belt and braces: even a grant given by mistake later cannot write through this login.
ALTER ROLE farm_grafana SET default_transaction_read_only = on;
-- A runaway panel query must not hold the store; dashboards answer in well under this.
ALTER ROLE farm_grafana SET statement_timeout = '30s';

SELECT format('GRANT CONNECT ON DATABASE %I TO farm_grafana', current_database())
\gexec
GRANT USAGE ON SCHEMA public TO farm_grafana;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO farm_grafana;
-- Tables later migrations create (as the owner) are readable too.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT SELECT ON TABLES TO farm_grafana;
