#!/usr/bin/env bash
# Runs every fuzz target of the repository (each func FuzzX in a _test.go
# file, found by go test -list, not listed here), one at a time, for FUZZTIME
# each (default 3s; any -fuzztime value, such as 30s or 10000x), and fails if
# one of them fails. Arguments are the packages to search (default ./...).
# Runs from any directory. A target that needs PostgreSQL or RabbitMQ finds
# them as the tests do (scripts/services.sh starts them).
#
# A failing input is written to testdata/fuzz/FuzzX/ in the target's
# package: once the defect is fixed, keep it there as a seed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_go
cd "$ROOT"
fuzztime=${FUZZTIME:-3s}
if (($# == 0)); then
	set -- ./...
fi

# Only packages whose tests declare a fuzz target are compiled for the list.
listing=$(go list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' "$@")
packages=()
while read -r pkg dir files; do
	[[ -n $files ]] || continue
	# shellcheck disable=SC2086 # the file names split on purpose
	if (cd "$dir" && grep -qE '^func Fuzz[A-Za-z0-9_]*\(' $files); then
		packages+=("$pkg")
	fi
done <<<"$listing"

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# fuzz_once runs target $2 of package $1 for fuzztime. It returns 0 when
# the target passed, 1 when it failed and 3 when only Go's fuzzing
# coordinator did: with a duration for -fuzztime, Go 1.26 may end a target
# that found nothing with "context deadline exceeded" (go.dev/issue/75804,
# fixed in Go 1.27), whereas a real failure names its input, written to
# testdata/fuzz or from the seed corpus.
fuzz_once() {
	if go test -run '^$' -fuzz "^${2}\$" -fuzztime "$fuzztime" "$1" 2>&1 | tee "$log"; then
		return 0
	fi
	if grep -q '^    context deadline exceeded$' "$log" &&
		! grep -qE 'Failing input written to|failure while testing seed corpus|^panic:' "$log"; then
		return 3
	fi
	return 1
}

targets=0
failed=()
flaked=()
for pkg in "${packages[@]}"; do
	if ! list=$(go test -list '^Fuzz' "$pkg"); then
		failed+=("$pkg (its tests do not build)")
		continue
	fi
	mapfile -t names < <(grep -E '^Fuzz' <<<"$list")
	for name in "${names[@]}"; do
		targets=$((targets + 1))
		printf '== %s %s (%s)\n' "$pkg" "$name" "$fuzztime"
		status=0
		fuzz_once "$pkg" "$name" || status=$?
		if ((status == 3)); then
			echo "fuzz.sh: $name ended on the fuzzing coordinator's deadline race, not an input; running it again"
			status=0
			fuzz_once "$pkg" "$name" || status=$?
		fi
		case $status in
		0) ;;
		3) flaked+=("$pkg $name") ;;
		*) failed+=("$pkg $name") ;;
		esac
	done
done

if ((targets == 0)); then
	echo "fuzz.sh: no fuzz target found in $*" >&2
	exit 1
fi
if ((${#failed[@]} > 0)); then
	printf 'fuzz.sh: failed, of %d fuzz targets run:\n' "$targets" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
if ((${#flaked[@]} > 0)); then
	printf 'fuzz.sh: twice ended on the coordinator'"'"'s deadline race, no input failing (go.dev/issue/75804):\n' >&2
	printf '  %s\n' "${flaked[@]}" >&2
fi
echo "fuzz.sh: $targets fuzz targets run for $fuzztime each, none failed"
