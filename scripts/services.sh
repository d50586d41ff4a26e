#!/usr/bin/env bash
# Makes sure PostgreSQL and RabbitMQ are available for the tests and the demo.
#
# Checks both services and, when needed and possible, starts or installs them
# (Debian/Ubuntu, as root), and sets PostgreSQL up for logical replication
# (restarting a local cluster once, as root). Safe to re-run: when both
# already work it changes nothing and finishes quickly.
set -euo pipefail

readonly PG_HOST=${PGHOST:-127.0.0.1}
readonly PG_PORT=${PGPORT:-5432}
readonly PG_USER=postgres
readonly TEST_DB=${OUTBOXMILL_TEST_DB:-test}
# Logical replication for the CDC relay: every test database may hold a slot
# and a walsender of its own, and test packages run in parallel.
readonly PG_MIN_SLOTS=64
readonly PG_MIN_SENDERS=64

readonly AMQP_HOST=127.0.0.1
readonly AMQP_PORT=5672
readonly AMQP_USER=guest
readonly AMQP_PASS=guest

readonly SELF=${0}

CHECK_ONLY=0
PG_INSTALLED_HERE=0
RABBIT_INSTALLED_HERE=0

usage() {
	cat <<EOF
Usage: $SELF [--check] [-h|--help]

Makes sure PostgreSQL ($PG_HOST:$PG_PORT, user $PG_USER, database $TEST_DB)
and RabbitMQ ($AMQP_HOST:$AMQP_PORT, user $AMQP_USER) are usable.
Starts them if they are installed but stopped; installs them with apt-get
when run as root. Sets PostgreSQL up for logical replication (wal_level
logical, max_replication_slots >= $PG_MIN_SLOTS, max_wal_senders >= $PG_MIN_SENDERS) with
ALTER SYSTEM and a restart, for a local cluster when run as root.
Prints one status line per service; exits 0 only if both are usable.

  --check     only check; never start, install or reconfigure anything
  -h, --help  show this help

Environment: PGHOST, PGPORT (default 127.0.0.1, 5432),
             OUTBOXMILL_TEST_DB (default test).
EOF
}

# --- helpers -----------------------------------------------------------------

have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [[ $(id -u) -eq 0 ]]; }
can_install() { is_root && have apt-get; }
err() { printf '%s\n' "$*" >&2; }

# Runs a command that changes the system, showing it first.
run() {
	printf '  + %s\n' "$*" >&2
	"$@"
}

is_local() {
	case $1 in
	127.0.0.1 | localhost | ::1 | /*) return 0 ;;
	*) return 1 ;;
	esac
}

tcp_open() {
	timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.5 s until it succeeds or
# the deadline passes.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		((SECONDS < deadline)) || return 1
		sleep 0.5
	done
}

apt_install() {
	DEBIAN_FRONTEND=noninteractive run apt-get install -y -q "$@" ||
		{ run apt-get update -q && DEBIAN_FRONTEND=noninteractive run apt-get install -y -q "$@"; }
}

# --- PostgreSQL --------------------------------------------------------------

pg_ready() {
	if have pg_isready; then
		pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
	elif [[ $PG_HOST == /* ]]; then
		[[ -S $PG_HOST/.s.PGSQL.$PG_PORT ]]
	else
		tcp_open "$PG_HOST" "$PG_PORT"
	fi
}

# Prints the installed PostgreSQL versions that have a "main" cluster.
pg_versions() {
	local dir
	for dir in /etc/postgresql/*/main; do
		if [[ -d $dir ]]; then
			basename "${dir%/main}"
		fi
	done
}

pg_sql() {
	psql -X -q -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres \
		-v ON_ERROR_STOP=1 -tA "$@"
}

# Lets local TCP clients connect without a password. Only used on clusters
# this script installed; the lines go first because pg_hba.conf is
# first-match.
pg_allow_local_trust() {
	local hba=/etc/postgresql/$1/main/pg_hba.conf
	local marker='# Added by scripts/services.sh: trust local TCP connections (development only)'
	[[ -f $hba ]] || return 1
	grep -qxF "$marker" "$hba" && return 0
	printf '  + add trust for 127.0.0.1/32 and ::1/128 to %s\n' "$hba" >&2
	local tmp
	tmp=$(mktemp)
	{
		printf '%s\n' "$marker" \
			'host    all    all    127.0.0.1/32    trust' \
			'host    all    all    ::1/128         trust' ''
		cat "$hba"
	} >"$tmp"
	cat "$tmp" >"$hba" # keeps the file's owner and mode
	rm -f "$tmp"
}

pg_install_hint() {
	err "  sudo apt-get update"
	err "  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql postgresql-client"
	err "  sudo pg_ctlcluster --skip-systemctl-redirect <version> main start"
	err "  then allow trust auth for 127.0.0.1/32 and ::1/128 in /etc/postgresql/<version>/main/pg_hba.conf"
	err "  and reload: sudo pg_ctlcluster --skip-systemctl-redirect <version> main reload"
}

start_postgres() {
	local where="$PG_HOST:$PG_PORT" versions v
	if ! is_local "$PG_HOST"; then
		err "postgres: not reachable at $where (not a local address, so nothing to start here)."
		return 1
	fi

	versions=$(pg_versions)
	if [[ -z $versions ]]; then
		if ! can_install; then
			err "postgres: not installed and not reachable at $where."
			err "Re-run as root (sudo $SELF), or run:"
			pg_install_hint
			return 1
		fi
		err "postgres: not installed; installing"
		if ! apt_install postgresql postgresql-client; then
			err "postgres: apt-get install failed; see the output above."
			return 1
		fi
		PG_INSTALLED_HERE=1
		versions=$(pg_versions)
		if [[ -z $versions ]]; then
			err "postgres: installed, but no cluster found under /etc/postgresql. Create one: sudo pg_createcluster <version> main"
			return 1
		fi
	fi

	if ! is_root; then
		err "postgres: installed but not accepting connections at $where. Start it with:"
		for v in $versions; do
			err "  sudo pg_ctlcluster --skip-systemctl-redirect $v main start"
		done
		return 1
	fi

	for v in $versions; do
		if ! pg_ctlcluster "$v" main status >/dev/null 2>&1; then
			# A failure here is reported by the readiness wait below.
			run pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
		fi
		if ((PG_INSTALLED_HERE)) && pg_allow_local_trust "$v"; then
			run pg_ctlcluster --skip-systemctl-redirect "$v" main reload || true
		fi
	done
}

# pg_replication_check reads the server's replication settings: REPL_NOW
# describes them, REPL_FIXES holds one ALTER SYSTEM statement per setting
# that falls short (none when all are set; higher values stay) and
# PG_SUPERUSER is "on" when PG_USER may run them.
REPL_NOW=''
REPL_FIXES=()
PG_SUPERUSER=''
pg_replication_check() {
	local query info level slots senders
	query="select current_setting('wal_level'), current_setting('max_replication_slots'),
	              current_setting('max_wal_senders'), current_setting('is_superuser')"
	REPL_NOW=""
	info=$(pg_sql <<<"$query") || return 1
	IFS='|' read -r level slots senders PG_SUPERUSER <<<"$info"
	REPL_NOW="wal_level=$level, max_replication_slots=$slots, max_wal_senders=$senders"
	REPL_FIXES=()
	# logical is the highest wal_level.
	[[ $level == logical ]] || REPL_FIXES+=("ALTER SYSTEM SET wal_level = logical")
	((slots >= PG_MIN_SLOTS)) || REPL_FIXES+=("ALTER SYSTEM SET max_replication_slots = $PG_MIN_SLOTS")
	((senders >= PG_MIN_SENDERS)) || REPL_FIXES+=("ALTER SYSTEM SET max_wal_senders = $PG_MIN_SENDERS")
}

# Prints "<version> <cluster>" of the local cluster that is online on
# PG_PORT, as pg_ctlcluster names it; nothing if there is none.
pg_cluster_on_port() {
	have pg_lsclusters || return 0
	pg_lsclusters -h 2>/dev/null | awk -v port="$PG_PORT" '$3 == port && $4 == "online" { print $1, $2; exit }' || true
}

# ensure_replication WHERE VERSION: makes sure the server is set up for
# logical replication. The settings only take effect at server start, so a
# change restarts the cluster; that is done only for a local cluster, as
# root, and never with --check. Otherwise it says what to run.
ensure_replication() {
	local where=$1 version=$2 cluster why='' stmt
	if ! pg_replication_check; then
		err "postgres: cannot read the replication settings at $where."
		return 1
	fi
	if ((${#REPL_FIXES[@]} == 0)); then
		return 0
	fi

	cluster=$(pg_cluster_on_port)
	# Unquoted on purpose: "<version> <cluster>" are two arguments.
	local restart=(pg_ctlcluster --skip-systemctl-redirect ${cluster:-"${version%%.*}" main} restart)
	if ! is_local "$PG_HOST"; then
		why="The server is not local; on its host, as a superuser, run"
	elif [[ $PG_SUPERUSER != on ]]; then
		why="User $PG_USER is not a superuser; as one, run"
	elif ((CHECK_ONLY)); then
		why="Run $SELF as root (without --check) to set it up, or run"
	elif ! is_root; then
		why="Re-run as root (sudo $SELF), or run"
	elif ! have pg_ctlcluster || [[ -z $cluster ]]; then
		why="No cluster is online on port $PG_PORT for pg_ctlcluster to restart; run"
	fi
	if [[ -n $why ]]; then
		err "postgres: not set up for logical replication at $where ($REPL_NOW;"
		err "  needs wal_level=logical, max_replication_slots >= $PG_MIN_SLOTS, max_wal_senders >= $PG_MIN_SENDERS)."
		err "$why:"
		for stmt in "${REPL_FIXES[@]}"; do
			err "  psql -h $PG_HOST -p $PG_PORT -U $PG_USER -d postgres -c '$stmt'"
		done
		err "  then restart the server, which reads these settings only at start-up:"
		err "  sudo ${restart[*]}"
		return 1
	fi

	err "postgres: $REPL_NOW; setting up logical replication (restarts the cluster)"
	local args=()
	for stmt in "${REPL_FIXES[@]}"; do
		args+=(-c "$stmt")
	done
	if ! run psql -X -q -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -v ON_ERROR_STOP=1 "${args[@]}"; then
		err "postgres: ALTER SYSTEM failed; see the output above."
		return 1
	fi
	# A failure here is reported by the readiness wait below.
	run "${restart[@]}" || true
	if ! wait_for 60 pg_ready; then
		err "postgres: not accepting connections at $where 60 s after the restart. See the logs in /var/log/postgresql/."
		return 1
	fi
	if ! pg_replication_check || ((${#REPL_FIXES[@]} > 0)); then
		err "postgres: still ${REPL_NOW:-unreadable} after the restart. A setting given on the server's command line overrides ALTER SYSTEM; see:"
		err "  psql -h $PG_HOST -p $PG_PORT -U $PG_USER -c \"select name, setting, source, sourcefile from pg_settings where name in ('wal_level', 'max_replication_slots', 'max_wal_senders')\""
		return 1
	fi
	err "postgres: now $REPL_NOW"
}

ensure_postgres() {
	local where="$PG_HOST:$PG_PORT" query info version exists

	if ! pg_ready; then
		if ((CHECK_ONLY)); then
			err "postgres: not reachable at $where. Run $SELF (without --check) to start or install it."
			return 1
		fi
		start_postgres || return 1
		if ! wait_for 60 pg_ready; then
			err "postgres: still not accepting connections at $where after 60 s. See the logs in /var/log/postgresql/."
			return 1
		fi
	fi

	if ! have psql; then
		err "postgres: psql not found. Install the client: sudo apt-get install -y postgresql-client"
		return 1
	fi

	query="select current_setting('server_version'),
	              exists (select 1 from pg_database where datname = :'db')"
	if ! info=$(pg_sql -v db="$TEST_DB" <<<"$query" 2>&1); then
		err "postgres: cannot query as user $PG_USER at $where: $info"
		if is_local "$PG_HOST"; then
			err "  Allow trust auth for local TCP: put these lines first in /etc/postgresql/<version>/main/pg_hba.conf"
			err "    host    all    all    127.0.0.1/32    trust"
			err "    host    all    all    ::1/128         trust"
			err "  then: sudo pg_ctlcluster --skip-systemctl-redirect <version> main reload"
		fi
		return 1
	fi
	IFS='|' read -r version exists <<<"$info"
	version=${version%% *} # "15.14 (Debian 15.14-0+deb12u1)" -> "15.14"

	if [[ $exists != t ]]; then
		if ((CHECK_ONLY)); then
			err "postgres: database '$TEST_DB' does not exist. Create it: createdb -h $PG_HOST -p $PG_PORT -U $PG_USER $TEST_DB"
			return 1
		fi
		if ! run createdb -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$TEST_DB"; then
			err "postgres: could not create database '$TEST_DB'."
			return 1
		fi
	fi

	ensure_replication "$where" "$version" || return 1

	echo "postgres: ok ($version at $where)"
}

# --- RabbitMQ ----------------------------------------------------------------

# A minimal AMQP 0-9-1 client, just enough to log in, open vhost "/" and close
# again. It uses only bash builtins, so it costs no extra processes. Bytes are
# handled as decimal numbers; OUT holds the payload being built.

OUT=()
put_u16() { OUT+=($(($1 >> 8 & 255)) $(($1 & 255))); }
put_u32() { OUT+=($(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255))); }
put_chars() {
	local i b
	for ((i = 0; i < ${#1}; i++)); do
		printf -v b '%d' "'${1:i:1}"
		OUT+=("$b")
	done
}
put_shortstr() {
	OUT+=("${#1}")
	put_chars "$1"
}
begin_method() { # CLASS METHOD
	OUT=()
	put_u16 "$1"
	put_u16 "$2"
}

# write_bytes FD BYTE...
write_bytes() {
	local fd=$1 b esc out=''
	shift
	for b in "$@"; do
		printf -v esc '\\0%03o' "$b"
		out+=$esc
	done
	printf '%b' "$out" >&"$fd"
}

# send_method FD: sends OUT as a method frame on channel 0.
send_method() {
	local n=${#OUT[@]}
	write_bytes "$1" 1 0 0 $((n >> 24 & 255)) $((n >> 16 & 255)) $((n >> 8 & 255)) $((n & 255)) "${OUT[@]}" 206
}

# read_bytes FD N: reads N bytes into IN (NUL-safe, 3 s timeout per byte).
IN=()
read_bytes() {
	local fd=$1 n=$2 c b LC_ALL=C
	IN=()
	while ((n-- > 0)); do
		IFS= read -r -d '' -n 1 -t 3 -u "$fd" c || return 1 # c is empty for a NUL byte
		printf -v b '%d' "'$c"
		IN+=("$b")
	done
}

# recv_method FD: reads one frame; sets METHOD to "class.method" (10.30 is
# Connection.Tune) and PAYLOAD to its bytes.
METHOD=''
PAYLOAD=()
recv_method() {
	local fd=$1 size
	METHOD=none
	read_bytes "$fd" 7 && ((IN[0] == 1)) || return 1
	size=$((IN[3] << 24 | IN[4] << 16 | IN[5] << 8 | IN[6]))
	read_bytes "$fd" $((size + 1)) || return 1
	PAYLOAD=("${IN[@]}")
	METHOD="${PAYLOAD[1]}.${PAYLOAD[3]}"
}

# amqp_login HOST PORT USER PASS: 0 = ok, 1 = handshake failed,
# 2 = login refused, 3 = no access to vhost "/".
amqp_login() {
	local user=$3 pass=$4 fd rc=0
	{ exec {fd}<>"/dev/tcp/$1/$2"; } 2>/dev/null || return 1

	write_bytes "$fd" 65 77 81 80 0 0 9 1 # "AMQP" 0-9-1
	recv_method "$fd" || true
	if [[ $METHOD != 10.10 ]]; then # Connection.Start
		exec {fd}>&-
		return 1
	fi

	begin_method 10 11 # Connection.Start-Ok
	put_u32 0          # no client properties
	put_shortstr PLAIN
	put_u32 $((2 + ${#user} + ${#pass}))
	OUT+=(0) && put_chars "$user" && OUT+=(0) && put_chars "$pass"
	put_shortstr en_US
	send_method "$fd"
	recv_method "$fd" || true
	if [[ $METHOD != 10.30 ]]; then # Connection.Tune; bad credentials get the socket closed
		exec {fd}>&-
		return 2
	fi

	begin_method 10 31 # Connection.Tune-Ok
	OUT+=("${PAYLOAD[@]:4:6}" 0 0) # channel-max and frame-max as offered, no heartbeats
	send_method "$fd"
	begin_method 10 40 # Connection.Open
	put_shortstr /
	OUT+=(0 0)
	send_method "$fd"
	recv_method "$fd" || true
	if [[ $METHOD == 10.41 ]]; then # Connection.Open-Ok
		begin_method 10 50 # Connection.Close
		put_u16 200
		OUT+=(0)
		put_u16 0
		put_u16 0
		send_method "$fd"
		recv_method "$fd" || true # Connection.Close-Ok
	else
		rc=3
	fi
	exec {fd}>&-
	return "$rc"
}

amqp_port_open() { tcp_open "$AMQP_HOST" "$AMQP_PORT"; }

# True when the Erlang node answers, even if the RabbitMQ app is stopped.
rabbit_node_up() {
	have rabbitmqctl && timeout 30 rabbitmqctl -q ping >/dev/null 2>&1
}

start_rabbitmq() {
	local where="$AMQP_HOST:$AMQP_PORT" log

	if ! have rabbitmq-server; then
		if ! can_install; then
			err "rabbitmq: not installed and not reachable at $where."
			err "Re-run as root (sudo $SELF), or run:"
			err "  sudo apt-get update"
			err "  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server"
			err "  sudo rabbitmq-server -detached"
			return 1
		fi
		err "rabbitmq: not installed; installing"
		if ! apt_install rabbitmq-server; then
			err "rabbitmq: apt-get install failed; see the output above."
			return 1
		fi
		RABBIT_INSTALLED_HERE=1
	fi

	if ! is_root; then
		err "rabbitmq: installed but not accepting connections at $where. Start it with:"
		err "  sudo rabbitmqctl start_app        # if the node runs but the app is stopped"
		err "  sudo rabbitmq-server -detached    # otherwise"
		return 1
	fi

	if rabbit_node_up; then
		run rabbitmqctl -q start_app || true
	elif ! amqp_port_open; then # the package may have started it already
		log=$(mktemp)
		printf '  + %s\n' 'rabbitmq-server -detached' >&2
		# Keep the daemon off our stdout/stderr so callers' pipes can close.
		if ! rabbitmq-server -detached </dev/null >"$log" 2>&1; then
			err "rabbitmq: rabbitmq-server -detached failed:"
			cat "$log" >&2
			rm -f "$log"
			return 1
		fi
		rm -f "$log"
	fi

	if ! wait_for 90 amqp_port_open; then
		err "rabbitmq: port $AMQP_PORT still closed after 90 s. See the logs in /var/log/rabbitmq/."
		return 1
	fi
	if have rabbitmqctl && ! timeout 60 rabbitmqctl -q await_startup >/dev/null 2>&1; then
		err "rabbitmq: port is open but 'rabbitmqctl await_startup' failed. See the logs in /var/log/rabbitmq/."
		return 1
	fi
}

# Creates guest/guest with full access to "/"; only on a broker this script installed.
rabbit_add_guest() {
	run rabbitmqctl -q add_user "$AMQP_USER" "$AMQP_PASS" &&
		run rabbitmqctl -q set_permissions -p / "$AMQP_USER" '.*' '.*' '.*'
}

check_guest_login() {
	local rc=0 users
	amqp_login "$AMQP_HOST" "$AMQP_PORT" "$AMQP_USER" "$AMQP_PASS" || rc=$?
	((rc == 0)) && return 0

	if ((rc == 2)) && have rabbitmqctl &&
		users=$(timeout 30 rabbitmqctl -q list_users 2>/dev/null) &&
		! awk -v u="$AMQP_USER" '$1 == u { found = 1 } END { exit !found }' <<<"$users"; then
		if ((RABBIT_INSTALLED_HERE)) && rabbit_add_guest; then
			rc=0
			amqp_login "$AMQP_HOST" "$AMQP_PORT" "$AMQP_USER" "$AMQP_PASS" || rc=$?
			((rc == 0)) && return 0
		else
			err "rabbitmq: user '$AMQP_USER' does not exist. Create it:"
			err "  sudo rabbitmqctl add_user $AMQP_USER $AMQP_PASS"
			err "  sudo rabbitmqctl set_permissions -p / $AMQP_USER '.*' '.*' '.*'"
			return 1
		fi
	fi

	case $rc in
	1) err "rabbitmq: port $AMQP_PORT is open but the AMQP handshake failed. See the logs in /var/log/rabbitmq/." ;;
	2) err "rabbitmq: login as $AMQP_USER/$AMQP_PASS refused. Reset it: sudo rabbitmqctl change_password $AMQP_USER $AMQP_PASS" ;;
	3) err "rabbitmq: $AMQP_USER cannot open vhost '/'. Grant access: sudo rabbitmqctl set_permissions -p / $AMQP_USER '.*' '.*' '.*'" ;;
	esac
	return 1
}

ensure_rabbitmq() {
	local where="$AMQP_HOST:$AMQP_PORT"

	if ! amqp_port_open; then
		if ((CHECK_ONLY)); then
			err "rabbitmq: not reachable at $where. Run $SELF (without --check) to start or install it."
			return 1
		fi
		start_rabbitmq || return 1
	fi
	check_guest_login || return 1

	echo "rabbitmq: ok ($where)"
}

# --- main --------------------------------------------------------------------

main() {
	while (($#)); do
		case $1 in
		--check) CHECK_ONLY=1 ;;
		-h | --help)
			usage
			return 0
			;;
		*)
			err "unknown argument: $1"
			usage >&2
			return 2
			;;
		esac
		shift
	done

	local rc=0
	ensure_postgres || rc=1
	ensure_rabbitmq || rc=1
	return "$rc"
}

main "$@"
