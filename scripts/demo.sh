#!/usr/bin/env bash
# Runs the demo: makes sure PostgreSQL and RabbitMQ are up, builds the
# commands and runs bin/demo, which starts both services (or, with -monolith,
# one monolith process running both modules), sends orders through the HTTP
# API and prints an integrity report. Arguments go to bin/demo unchanged (see
# ./scripts/demo.sh -h). Runs from any directory; relative paths in the
# arguments are taken from the directory it is run in.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_go
"$ROOT/scripts/services.sh" >&2
"$ROOT/scripts/build.sh" >&2
exec "$ROOT/bin/demo" -bin-dir "$ROOT/bin" "$@"
