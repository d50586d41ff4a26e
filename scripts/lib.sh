# Shared by build.sh, demo.sh and test.sh; source it, do not run it.
#
# Sets ROOT to the repository root and defines require_go, which makes sure a
# Go toolchain recent enough for go.mod is on PATH, or explains how to get one.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT

# require_go exits with a message unless Go is installed and new enough.
require_go() {
	local want have toolchain arch
	want=$(awk '$1 == "go" { print $2; exit }' "$ROOT/go.mod")
	if ! command -v go >/dev/null 2>&1; then
		if [[ -x /usr/local/go/bin/go ]]; then
			# The official archive installs here without touching PATH.
			export PATH="/usr/local/go/bin:$PATH"
		else
			case $(uname -m) in
			aarch64 | arm64) arch=arm64 ;;
			*) arch=amd64 ;;
			esac
			printf 'Go is not installed (no "go" on PATH, nor /usr/local/go/bin/go).\n' >&2
			printf 'Install Go %s or newer from https://go.dev/dl/, for example:\n' "$want" >&2
			printf '  curl -fsSL https://go.dev/dl/go%s.linux-%s.tar.gz | sudo tar -C /usr/local -xz\n' "$want" "$arch" >&2
			printf '  export PATH=/usr/local/go/bin:$PATH\n' >&2
			printf 'then run this script again.\n' >&2
			exit 1
		fi
	fi

	have=$(go env GOVERSION)
	have=${have#go}
	toolchain=$(go env GOTOOLCHAIN)
	if [[ -n $want ]] && [[ $(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1) != "$want" ]]; then
		if [[ $toolchain == local ]]; then
			printf 'Go %s is installed, but go.mod needs Go %s or newer and GOTOOLCHAIN=local forbids fetching it.\n' "$have" "$want" >&2
			printf 'Install Go %s from https://go.dev/dl/, or run with GOTOOLCHAIN=auto to let go fetch it.\n' "$want" >&2
			exit 1
		fi
		printf 'Go %s is installed; go.mod needs %s, which go fetches itself (GOTOOLCHAIN=%s).\n' "$have" "$want" "$toolchain" >&2
	fi
}
