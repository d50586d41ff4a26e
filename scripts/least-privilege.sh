#!/usr/bin/env bash
# Sets the sample services up to run with least privilege on the local
# PostgreSQL and RabbitMQ, then prints how to start them. Runs from any
# directory; run it again to rotate every password.
#
# PostgreSQL (as ADMIN_DATABASE_URL, a superuser):
#   ${PREFIX}migrator            owns the two databases and migrates them
#   ${PREFIX}orders_app          reads and writes orders' tables and the framework's
#   ${PREFIX}settlement_app      reads and writes settlement's tables and the framework's
#   databases ${PREFIX}orders and ${PREFIX}settlement, which only the
#   migrator and the database's runtime role may connect to
# RabbitMQ (rabbitmqctl on this machine):
#   users ${PREFIX}orders and ${PREFIX}settlement: nothing to configure,
#   publish to their module's events exchange only, read their own queues
# The migrate command of each service then runs as the migrator (with the
# broker user of AMQP_ADMIN_URL, which may declare) and grants each runtime
# role its tables. The URLs of each service go to files in SECRETS_DIR
# (mode 0600), for DATABASE_URL_FILE and AMQP_URL_FILE.
#
# Settings (environment): PREFIX (outboxmill_), NAMESPACE (outboxmill),
# ADMIN_DATABASE_URL (postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable),
# AMQP_ADMIN_URL (amqp://guest:guest@127.0.0.1:5672/), PG_HOST (127.0.0.1:5432),
# AMQP_HOST (127.0.0.1:5672), SECRETS_DIR (.secrets under the repository),
# BIN_DIR (built orders and settlement commands; default: go run).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PREFIX=${PREFIX:-outboxmill_}
NAMESPACE=${NAMESPACE:-outboxmill}
ADMIN_DATABASE_URL=${ADMIN_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
AMQP_ADMIN_URL=${AMQP_ADMIN_URL:-amqp://guest:guest@127.0.0.1:5672/}
PG_HOST=${PG_HOST:-127.0.0.1:5432}
AMQP_HOST=${AMQP_HOST:-127.0.0.1:5672}
SECRETS_DIR=${SECRETS_DIR:-$ROOT/.secrets}
BIN_DIR=${BIN_DIR:-}

if [[ ! $PREFIX =~ ^[a-z][a-z0-9_]{0,30}$ ]]; then
	echo "PREFIX must be 1 to 31 of a-z, 0-9 and _, starting with a letter (got '$PREFIX')" >&2
	exit 2
fi
for tool in psql rabbitmqctl; do
	command -v "$tool" >/dev/null || { echo "$tool is not installed: this script sets up the local servers" >&2; exit 1; }
done

password() { od -An -N18 -tx1 /dev/urandom | tr -d ' \n'; }
sql() { psql "$ADMIN_DATABASE_URL" -v ON_ERROR_STOP=1 -qtA "$@"; }
# run CMD ARGS... runs a sample command, built or through go run.
run() {
	local cmd=$1
	shift
	if [[ -n $BIN_DIR ]]; then
		"$BIN_DIR/$cmd" "$@"
	else
		require_go
		(cd "$ROOT" && go run "./cmd/$cmd" "$@")
	fi
}

migrator=${PREFIX}migrator
umask 077
mkdir -p "$SECRETS_DIR"

# Roles: created, or given a new password.
for role in "$migrator" "${PREFIX}orders_app" "${PREFIX}settlement_app"; do
	pw=$(password)
	sql -v role="$role" -v pw="$pw" <<'SQL'
SELECT format(CASE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = :'role')
	THEN 'ALTER ROLE %I LOGIN PASSWORD %L' ELSE 'CREATE ROLE %I LOGIN PASSWORD %L' END, :'role', :'pw') \gexec
SQL
	printf '%s' "$pw" >"$SECRETS_DIR/$role.password"
done

for module in orders settlement; do
	db=${PREFIX}${module}
	app=${PREFIX}${module}_app
	owner=$(sql -c "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = '$db'")
	if [[ -z $owner ]]; then
		sql -c "CREATE DATABASE \"$db\" OWNER \"$migrator\""
	elif [[ $owner != "$migrator" ]]; then
		echo "database $db exists and belongs to $owner, not $migrator: drop it or choose another PREFIX" >&2
		exit 1
	fi
	sql -c "REVOKE ALL ON DATABASE \"$db\" FROM PUBLIC" -c "GRANT CONNECT ON DATABASE \"$db\" TO \"$app\""
	# The migrator owns the public schema (PostgreSQL 15 gives it to the
	# database owner; older servers to the superuser, and let PUBLIC create
	# there).
	sql <<SQL
\connect "$db"
ALTER SCHEMA public OWNER TO "$migrator";
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
SQL

	# The broker user of the service.
	user=${PREFIX}${module}
	pw=$(password)
	if rabbitmqctl -q list_users | awk '{print $1}' | grep -qx "$user"; then
		rabbitmqctl -q change_password "$user" "$pw"
	else
		rabbitmqctl -q add_user "$user" "$pw"
	fi
	# outboxctl prints the rabbitmqctl command, its arguments quoted.
	eval "$(run outboxctl permissions --modules "$module" --user "$user" --namespace "$NAMESPACE")"

	# Migrate as the migrator, granting the runtime role its tables.
	DATABASE_URL="postgres://$migrator:$(cat "$SECRETS_DIR/$migrator.password")@$PG_HOST/$db?sslmode=disable" \
		AMQP_URL="$AMQP_ADMIN_URL" OUTBOXMILL_NAMESPACE="$NAMESPACE" \
		run "$module" migrate -runtime-role "$app"

	printf 'postgres://%s:%s@%s/%s?sslmode=disable' "$app" "$(cat "$SECRETS_DIR/$app.password")" "$PG_HOST" "$db" >"$SECRETS_DIR/$module.database-url"
	printf 'amqp://%s:%s@%s/' "$user" "$pw" "$AMQP_HOST" >"$SECRETS_DIR/$module.amqp-url"
done

cat <<EOF
Set up. Start the services with their runtime roles and broker users:
  MIGRATE=false OUTBOXMILL_NAMESPACE=$NAMESPACE DATABASE_URL_FILE=$SECRETS_DIR/orders.database-url AMQP_URL_FILE=$SECRETS_DIR/orders.amqp-url go run ./cmd/orders
  MIGRATE=false OUTBOXMILL_NAMESPACE=$NAMESPACE DATABASE_URL_FILE=$SECRETS_DIR/settlement.database-url AMQP_URL_FILE=$SECRETS_DIR/settlement.amqp-url go run ./cmd/settlement
Run this script again to rotate every password, then restart the services.
EOF
