#!/usr/bin/env bash
# Builds the orders, settlement, demo and outboxctl commands into bin/ at the
# repository root. Runs from any directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_go
cd "$ROOT"
go mod download
go build -o bin/ ./cmd/orders ./cmd/settlement ./cmd/monolith ./cmd/demo ./cmd/outboxctl
echo "built bin/orders bin/settlement bin/monolith bin/demo bin/outboxctl"
