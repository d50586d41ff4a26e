#!/usr/bin/env bash
# Runs the fault-injection suite (tests/chaos) verbosely, keeps its output in
# out/chaos.log and prints the summary table of all scenarios at the end.
set -euo pipefail

usage() {
	cat <<USAGE
Usage: $0 [go test flags...]

Runs 'go test ./tests/chaos -v' against the local PostgreSQL and RabbitMQ
(see scripts/services.sh) and prints the integrity ledger of every scenario
and the summary table. Extra arguments go to 'go test', for example
  $0 -run 'TestChaos_(KillOrders|Rollback)'

Environment:
  CHAOS_RELAY_KIND  run the orders service with -relay-kind \$CHAOS_RELAY_KIND
                    (outboxmill, cdc or watermill) in every scenario; unset: the
                    service's default relay, and the scenarios of the relay's own
                    faults once for outboxmill and once for cdc
  CHAOS_LOG_DIR     keep the services' logs there, one directory per scenario
USAGE
}

case ${1:-} in
-h | --help)
	usage
	exit 0
	;;
esac

cd "$(dirname "$0")/.."
scripts/services.sh --check
mkdir -p out
log=out/chaos.log

status=0
go test ./tests/chaos -v -count=1 -timeout 15m "$@" 2>&1 | tee "$log" || status=$?

echo
echo "full output: $log"
if grep -q '^chaos summary' "$log"; then
	sed -n '/^chaos summary/,/^\(ok\|FAIL\|---\)/p' "$log" | grep -v '^\(ok\|FAIL\|---\)'
fi
# The long-transaction scenario's figures, one line per relay kind and hold.
if grep -q '^chaos hold' "$log"; then
	echo
	grep '^chaos hold' "$log"
fi
exit "$status"
