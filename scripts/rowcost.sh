#!/usr/bin/env bash
# What the outbox's own rows cost PostgreSQL, measured without the rest of
# the pipeline: pgbench runs the transactions the framework sends, each in one
# round trip (a pipeline, as postgres.UnitOfWork and Dedup.PipelineBatch send
# them), with and without the outbox's rows, alternated, and prints each
# variant's rate and its ratio to the transaction without them:
#
#   producer   the order row alone (the floor's transaction)
#              the order row and its outbox row (a 787-byte forwarder envelope)
#   consumer   a batch's ledger entries alone (the floor's transaction)
#              and the batch's processed_events markers
#              and the version guard's aggregate_versions rows (monotonic)
#
# The schema is the framework's (adapters/*/migrations) and watermill-sql's
# outbox table, in a database of its own that the script drops at the end.
# Usage: scripts/rowcost.sh [ROUNDS (3)] [SECONDS per run (4)] [EVENTS per
# consumer batch (4)]. Needs pgbench (postgresql-client) and the server of
# OUTBOXMILL_ADMIN_DATABASE_URL (default: the local one, as the bench uses).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

rounds=${1:-3} secs=${2:-4} batch=${3:-4}
for n in "$rounds" "$secs" "$batch"; do
	if ! [[ $n =~ ^[1-9][0-9]{0,2}$ ]]; then
		echo "usage: $0 [ROUNDS] [SECONDS] [EVENTS per batch], each 1..999" >&2
		exit 2
	fi
done
command -v pgbench >/dev/null || {
	echo "pgbench is not installed (Debian: apt-get install postgresql-client)" >&2
	exit 1
}
admin=${OUTBOXMILL_ADMIN_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
db=obm_rowcost_$$
url=${admin%%\?*}
url=${url%/*}/$db
work=$(mktemp -d)
cleanup() {
	psql -qX "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
psql -qX "$admin" -c "CREATE DATABASE $db" >/dev/null
psql -qX -v ON_ERROR_STOP=1 "$url" \
	-f "$ROOT/adapters/postgres/migrations/001_framework.sql" \
	-f "$ROOT/adapters/orders/migrations/001_orders.sql" \
	-f "$ROOT/adapters/settlement/migrations/001_settlement.sql" >/dev/null
# watermill-sql's outbox table (DefaultPostgreSQLSchema), as outbox.Initialize
# creates it.
psql -qX -v ON_ERROR_STOP=1 "$url" >/dev/null <<'SQL'
CREATE TABLE watermill_rowcost_outbox (
	"offset" BIGSERIAL,
	"uuid" VARCHAR(36) NOT NULL,
	"created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
	"payload" JSON DEFAULT NULL,
	"metadata" JSON DEFAULT NULL,
	"transaction_id" xid8 NOT NULL,
	PRIMARY KEY ("transaction_id", "offset")
);
SQL

# An OrderPaid event in the forwarder envelope, as outbox.Writer stores it.
envelope='{"destination_topic": "orders.OrderPaid.7", "uuid": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "payload": "eyJldmVudF9pZCI6ICIwMTkzYTFiMi1jM2Q0LTdlNWYtOGE5Yi0wYzFkMmUzZjRhNWIiLCAiZXZlbnRfdHlwZSI6ICJPcmRlclBhaWQiLCAic2NoZW1hX3ZlcnNpb24iOiAxLCAiYWdncmVnYXRlX3R5cGUiOiAiT3JkZXIiLCAiYWdncmVnYXRlX2lkIjogIm9yZC0wMTkzYTFiMi1jM2Q0LTdlNWYtOGE5YiIsICJhZ2dyZWdhdGVfdmVyc2lvbiI6IDIsICJvY2N1cnJlZF9hdCI6ICIyMDI2LTEyLTA3VDAwOjAwOjAwLjEyMzQ1NloiLCAicGF5bG9hZCI6IHsib3JkZXJfaWQiOiAib3JkLTAxOTNhMWIyLWMzZDQtN2U1Zi04YTliIiwgImN1c3RvbWVyX2lkIjogImN1c3QtMTIzNDU2IiwgImFtb3VudCI6IDEyMzQ1LCAiY3VycmVuY3kiOiAiRVVSIn19", "metadata": {"event_type": "OrderPaid", "aggregate_type": "Order", "aggregate_id": "ord-0193a1b2", "aggregate_version": "2", "occurred_at": "2026-12-07T00:00:00.123456Z", "name": "OrderPaid"}}'
order="INSERT INTO orders (id, customer_id, amount, currency, status, version) VALUES (gen_random_uuid()::text, 'cust-1', 12345, 'EUR', 'paid', 2);"
outbox="INSERT INTO watermill_rowcost_outbox (uuid, payload, metadata, transaction_id) VALUES (gen_random_uuid()::text, '$envelope', '{}', pg_current_xact_id());"
# A batch of $batch events: fresh ids per transaction.
ids="(SELECT array_agg(gen_random_uuid()::text) FROM generate_series(1, $batch))"
ledger="INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
	SELECT 'ord-' || e, e, k, 100, 'EUR', now() FROM unnest($ids) AS e, unnest(ARRAY['platform_fee', 'merchant_credit']) AS k;"
markers="INSERT INTO processed_events (event_id, handler) SELECT id, 'settle' FROM unnest($ids) AS id ORDER BY id;"
# The statement postgres.VersionGuard.QueueBatch sends in monotonic mode (its
# "true OR EXISTS (...)" filter, always true there, left out). Keep the two in
# step when the guard's statement changes.
guard="WITH input AS (
	SELECT 'Order' AS aggregate_type, id AS aggregate_id, 2 AS first_version, 2 AS last_version FROM unnest($ids) AS id
), applied AS (
	INSERT INTO aggregate_versions AS v (handler, aggregate_type, aggregate_id, version)
	SELECT 'settle', i.aggregate_type, i.aggregate_id, i.last_version FROM input i
	ORDER BY i.aggregate_type, i.aggregate_id
	ON CONFLICT (handler, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version, applied_at = now()
	WHERE EXISTS (
		SELECT 1 FROM input i
		WHERE i.aggregate_type = EXCLUDED.aggregate_type AND i.aggregate_id = EXCLUDED.aggregate_id AND v.version < i.first_version)
	RETURNING 1
)
SELECT 1 / (CASE WHEN (SELECT count(*) FROM applied) = $batch THEN 1 ELSE 0 END);"

variants=(producer-order producer-order+outbox consumer-ledger consumer-ledger+markers consumer-ledger+markers+guard)
script() {
	local body
	case $1 in
	producer-order) body=$order ;;
	producer-order+outbox) body="$order
$outbox" ;;
	consumer-ledger) body=$ledger ;;
	consumer-ledger+markers) body="$markers
$ledger" ;;
	consumer-ledger+markers+guard) body="$markers
$guard
$ledger" ;;
	esac
	printf '\\startpipeline\nBEGIN;\n%s\nCOMMIT;\n\\endpipeline\n' "$body" >"$work/$1.sql"
}
for v in "${variants[@]}"; do
	script "$v"
done

printf 'rowcost: %d rounds of %d s per variant, 8 clients, consumer batches of %d events, database %s\n' \
	"$rounds" "$secs" "$batch" "$db"
for ((r = 1; r <= rounds; r++)); do
	for v in "${variants[@]}"; do
		tps=$(pgbench -n -M prepared -c 8 -j 2 -T "$secs" -f "$work/$v.sql" "$url" 2>"$work/err" |
			awk '/^tps/ { printf "%.0f", $3 }')
		if [[ -z $tps ]]; then
			echo "pgbench failed on $v:" >&2
			cat "$work/err" >&2
			exit 1
		fi
		echo "$v $tps" >>"$work/results"
		printf '  round %d  %-30s %6s transactions/s\n' "$r" "$v" "$tps"
	done
done
echo
median() { sort -n | awk '{ x[NR] = $1 } END { print (NR % 2) ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }'; }
printf '%-30s %10s %10s %10s\n' "transaction (median)" "tx/s" "events/s" "vs alone"
for v in "${variants[@]}"; do
	m=$(awk -v v="$v" '$1 == v { print $2 }' "$work/results" | median)
	per=1 base=producer-order
	if [[ $v == consumer-* ]]; then
		per=$batch base=consumer-ledger
	fi
	b=$(awk -v v="$base" '$1 == v { print $2 }' "$work/results" | median)
	awk -v v="$v" -v m="$m" -v per="$per" -v b="$b" 'BEGIN { printf "%-30s %10.0f %10.0f %9.2fx\n", v, m, m * per, m / b }'
done
