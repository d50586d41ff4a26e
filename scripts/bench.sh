#!/usr/bin/env bash
# Runs the benchmark: makes sure PostgreSQL and RabbitMQ are up, builds
# cmd/bench and runs it with the given flags (for example -quick, -out DIR,
# -relay-kinds outboxmill,cdc, -readme README.md; -h lists them all). By
# default it measures every relay kind: watermill, outboxmill and cdc, each in
# the default wire format (standard) and, beside it, packed (-formats).
# The report goes to ./bench-out unless -out says otherwise.
set -euo pipefail

cd "$(dirname "$0")/.."
scripts/services.sh >&2
mkdir -p bin
go build -o bin/bench ./cmd/bench
exec bin/bench "$@"
