#!/usr/bin/env bash
# Runs the whole test suite: makes sure PostgreSQL and RabbitMQ are up, then
# go vet and go test over every package, then every fuzz target for FUZZTIME
# (default 3s) each (scripts/fuzz.sh). Arguments go to go test (for example
# -run TestEndToEnd -v) and skip the fuzzing, as FUZZTIME=0 does. Runs from
# any directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_go
"$ROOT/scripts/services.sh"
cd "$ROOT"
go mod download
go vet ./...
# Three packages at a time: most of the suite
# waits on the servers (traffic at a set rate, restarts); the
# chaos scenarios, the longest package, go first.
go test -p 3 -count=1 -timeout 14m ./tests/chaos ./... "$@"
if (($# == 0)) && [[ ${FUZZTIME:-3s} != 0 ]]; then
	FUZZTIME=${FUZZTIME:-3s} "$ROOT/scripts/fuzz.sh"
fi
