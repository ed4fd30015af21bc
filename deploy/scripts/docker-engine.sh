#!/usr/bin/env bash
# A private Docker engine for the container tests, beside (never instead of) any engine the
# machine already runs: its own data root, exec root, pidfile and socket.
#
#   docker-engine.sh start         install the engine if missing, start it, wait until it answers
#   docker-engine.sh stop          stop it by its pid and remove what it added to the machine:
#                                  processes it left (shims, docker-proxy), bridges (docker0,
#                                  compose networks), veths, iptables rules and chains (DOCKER,
#                                  DOCKER-USER, DOCKER-ISOLATION-STAGE-*), the nftables tables
#                                  iptables-nft created, mounts, the FORWARD policy and
#                                  ip_forward setting it changed, /run/docker, /run/containerd
#                                  and /etc/docker/key.json; then compare the machine with what
#                                  it was before the start and fail, naming each thing, if
#                                  anything of the engine is still there
#   docker-engine.sh run CMD...    start, run CMD with DOCKER_HOST set, stop on exit (even on
#                                  failure or Ctrl-C); exits with CMD's status, or 1 if CMD
#                                  passed but the machine was not left as it was
#
# Settings (environment): TENSOROPS_DOCKER_ROOT (images and build cache, kept between runs;
# default /var/lib/tensorops-docker), TENSOROPS_DOCKER_SOCK (default
# /run/tensorops-docker.sock). Needs root (dockerd does) and Debian's apt for the install.
# Any failure to install or start the engine ends with a non-zero status and the reason.
set -euo pipefail

ROOT=${TENSOROPS_DOCKER_ROOT:-/var/lib/tensorops-docker}
SOCK=${TENSOROPS_DOCKER_SOCK:-/run/tensorops-docker.sock}
EXEC_ROOT=${SOCK%.sock}.exec
PIDFILE=${SOCK%.sock}.pid
STATE=${SOCK%.sock}.state     # what the machine looked like before the engine started
LOG=$ROOT/engine.log            # kept after stop, for a post-mortem
PACKAGES=(docker.io docker-compose debootstrap)
# iptables for the engine's rules; nftables (nft) to remove the tables iptables-nft creates
TOOLS=(iptables nftables)
# Paths dockerd and its containerd create outside the roots above whatever their flags say
# (the shims' sockets, the daemon's identity key): removed on stop unless they were there.
OUTSIDE=(/run/docker /run/containerd /etc/docker/key.json)

say() { echo "docker-engine: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    [ -x /usr/bin/docker ] || command -v docker >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    command -v iptables >/dev/null 2>&1 || missing+=(iptables)
    command -v nft >/dev/null 2>&1 || missing+=(nftables)
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "cannot install ${missing[*]}: no apt-get on this machine"
    say "installing ${PACKAGES[*]} ${TOOLS[*]} (missing: ${missing[*]})"
    apt-get update -q >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" "${TOOLS[@]}" \
        >/dev/null || die "apt-get install ${PACKAGES[*]} ${TOOLS[*]} failed"
    command -v dockerd >/dev/null 2>&1 || die "dockerd is still missing after installing docker.io"
}

running_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid; pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

engine_processes() {  # "pid name" of this engine's processes running now (those naming its
    # roots or socket on their command line; docker-proxy names none of them)
    local pid name
    ps -eo pid=,comm= | awk '$2 ~ /^(dockerd|containerd|containerd-shim.*|docker-proxy|runc)$/ {print $1, $2}' \
        | while read -r pid name; do
            if [ "$name" = docker-proxy ] || tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null \
                    | grep -qF -e "$ROOT" -e "$EXEC_ROOT" -e "$SOCK"; then
                echo "$pid $name"
            fi
        done
}

iptables_chains() {  # "table chain" lines of every chain that exists now
    local table
    for table in filter nat; do
        iptables -t "$table" -S 2>/dev/null | awk -v t="$table" '$1 == "-N" {print t, $2}'
    done
}

start() {
    [ "$(id -u)" = 0 ] || die "the engine needs root (dockerd), running as uid $(id -u)"
    if pid=$(running_pid); then
        say "already running (pid $pid, $SOCK)"
        return 0
    fi
    install_packages
    mkdir -p "$STATE" "$ROOT"
    # nftables tables first: listing them with iptables-nft would create them
    if command -v nft >/dev/null 2>&1; then nft list tables > "$STATE/nft_tables" 2>/dev/null || true; fi
    local path
    for path in "${OUTSIDE[@]}"; do [ -e "$path" ] && echo "$path"; done > "$STATE/outside" || true
    ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' > "$STATE/links"
    cat /proc/sys/net/ipv4/ip_forward > "$STATE/ip_forward"
    engine_processes > "$STATE/processes"
    iptables_chains > "$STATE/chains"
    iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}' > "$STATE/forward_policy" || true
    say "starting dockerd (data root $ROOT, socket $SOCK)"
    # setsid: the engine is not in the caller's process group, so a Ctrl-C reaches the
    # tests and then our stop(), not dockerd half-way through its work.
    setsid dockerd --data-root "$ROOT" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" \
        -H "unix://$SOCK" --log-level warn >"$LOG" 2>&1 < /dev/null &
    local pid=$! deadline=$((SECONDS + 60))
    echo "$pid" > "$STATE/pid"
    STARTED=$pid  # run stops only an engine it started itself
    until docker -H "unix://$SOCK" version >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$LOG" >&2 || true
            die "dockerd exited during startup (log above, full log: $LOG)"
        fi
        [ $SECONDS -lt $deadline ] || { tail -n 20 "$LOG" >&2; stop || true; die "dockerd did not answer within 60 s"; }
        sleep 0.5
    done
    say "ready: DOCKER_HOST=unix://$SOCK (dockerd pid $pid, $(docker -H "unix://$SOCK" version --format '{{.Server.Version}}'))"
}

stop() {
    local pid=""
    pid=$(running_pid) || pid=$(cat "$STATE/pid" 2>/dev/null) || true
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "stopping dockerd (pid $pid)"
        kill -TERM "$pid"
        local deadline=$((SECONDS + 60))
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            say "dockerd ignored SIGTERM for 60 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 1
        fi
    fi
    [ -d "$STATE" ] || { rm -f "$SOCK" "$PIDFILE"; return 0; }
    # Processes the engine started and left (shims, docker-proxy after a SIGKILL): by pid.
    local pids
    pids=$(new_processes | awk '{print $1}')
    if [ -n "$pids" ]; then
        say "terminating what the engine left running: $(new_processes | tr '\n' ' ')"
        # shellcheck disable=SC2086
        kill -TERM $pids 2>/dev/null || true
        sleep 2
        # shellcheck disable=SC2086
        kill -KILL $(new_processes | awk '{print $1}') 2>/dev/null || true
    fi
    # Mounts left behind (container rootfs, network namespaces) under our roots.
    local m
    for m in $(awk -v a="$ROOT/" -v b="$EXEC_ROOT/" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' \
               /proc/self/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    # Network links the engine added: docker0, br-<network id>, veth pairs.
    local link
    for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//'); do
        grep -qx "$link" "$STATE/links" && continue
        case "$link" in
            docker0|br-*|veth*) ip link delete "$link" 2>/dev/null && say "removed link $link" || true ;;
        esac
    done
    if command -v iptables >/dev/null 2>&1; then
        local table chain rule
        # Rules in the built-in chains that jump to the engine's chains or name its bridges.
        for table in filter nat; do
            while read -r rule; do
                # shellcheck disable=SC2086
                iptables -t "$table" ${rule/-A /-D } 2>/dev/null || true
            done < <(iptables -t "$table" -S 2>/dev/null \
                     | awk '$1 == "-A" && /-j DOCKER|docker0|br-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]/')
        done
        # Then the chains it created (flushed first; a chain that existed before stays).
        while read -r table chain; do
            case "$chain" in DOCKER|DOCKER-*) ;; *) continue ;; esac
            grep -qx "$table $chain" "$STATE/chains" && continue
            iptables -t "$table" -F "$chain" 2>/dev/null || true
        done < <(iptables_chains)
        while read -r table chain; do
            case "$chain" in DOCKER|DOCKER-*) ;; *) continue ;; esac
            grep -qx "$table $chain" "$STATE/chains" && continue
            iptables -t "$table" -X "$chain" 2>/dev/null && say "removed iptables chain $table/$chain" || true
        done < <(iptables_chains)
    fi
    # dockerd turns the FORWARD policy to DROP when it enables forwarding: put it back.
    if [ -s "$STATE/forward_policy" ] && command -v iptables >/dev/null 2>&1; then
        iptables -P FORWARD "$(cat "$STATE/forward_policy")" 2>/dev/null || true
    fi
    if [ -f "$STATE/ip_forward" ]; then
        cat "$STATE/ip_forward" > /proc/sys/net/ipv4/ip_forward 2>/dev/null || true
    fi
    # Tables that iptables-nft created for the engine and that hold no rule any more (only
    # the table, its base chains and their hook lines): gone too. A table with any other
    # line (a rule, a set, a map) is someone else's and stays.
    if [ -f "$STATE/nft_tables" ] && command -v nft >/dev/null 2>&1; then
        local family name
        while read -r _ family name; do
            grep -qx "table $family $name" "$STATE/nft_tables" && continue
            if nft list table "$family" "$name" 2>/dev/null \
                    | grep -qvE '^[[:space:]]*(table [a-z0-9]+ [^ ]+ \{|chain [^ ]+ \{|type [a-z]+ hook [a-z]+ .*;|\}|)[[:space:]]*$'; then
                say "kept nftables table $family $name: it holds rules"
                continue
            fi
            nft delete table "$family" "$name" 2>/dev/null && say "removed nftables table $family $name" || true
        done < <(nft list tables 2>/dev/null)
    fi
    local path
    for path in "${OUTSIDE[@]}"; do
        grep -qx "$path" "$STATE/outside" 2>/dev/null && continue
        if [ -d "$path" ]; then  # empty folders only: anything left in them is reported
            find "$path" -depth -type d -empty -delete 2>/dev/null || true
            [ -e "$path" ] && say "left $path: not empty ($(find "$path" | head -3 | tr '\n' ' '))" || true
        elif [ -e "$path" ]; then
            rm -f "$path"
        fi
    done
    rm -rf "$EXEC_ROOT"
    rm -f "$SOCK" "$PIDFILE"
    local left
    left=$(leftovers)
    rm -rf "$STATE"
    if [ -n "$left" ]; then
        say "ERROR: the machine is not as it was before the engine started:"
        printf '  %s\n' "$left" >&2
        return 1
    fi
    say "stopped, nothing left on the machine; images and build cache kept in $ROOT"
}

new_processes() {  # engine processes that were not running before start
    engine_processes | while read -r pid name; do
        grep -qx "$pid $name" "$STATE/processes" 2>/dev/null || echo "$pid $name"
    done
}

leftovers() {  # one line per thing the engine added and that is still there
    local pid link table chain family name path m
    pid=$(cat "$STATE/pid" 2>/dev/null) || true
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "dockerd still running (pid $pid)"
    new_processes | sed 's/^/process /'
    awk -v a="$ROOT/" -v b="$EXEC_ROOT/" 'index($2, a) == 1 || index($2, b) == 1 {print "mount " $2}' /proc/self/mounts
    for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//'); do
        grep -qx "$link" "$STATE/links" || echo "network link $link"
    done
    if command -v iptables >/dev/null 2>&1; then
        while read -r table chain; do
            grep -qx "$table $chain" "$STATE/chains" || echo "iptables chain $table/$chain"
        done < <(iptables_chains)
        for table in filter nat; do
            iptables -t "$table" -S 2>/dev/null | grep -E -- '-j DOCKER|docker0|br-[0-9a-f]{12}' \
                | sed "s/^/iptables $table rule /" || true
        done
    fi
    if [ -f "$STATE/nft_tables" ] && command -v nft >/dev/null 2>&1; then
        while read -r _ family name; do
            grep -qx "table $family $name" "$STATE/nft_tables" || echo "nftables table $family $name"
        done < <(nft list tables 2>/dev/null)
    fi
    [ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$(cat "$STATE/ip_forward" 2>/dev/null)" ] \
        || echo "net.ipv4.ip_forward $(cat /proc/sys/net/ipv4/ip_forward), was $(cat "$STATE/ip_forward" 2>/dev/null)"
    for path in "${OUTSIDE[@]}"; do
        [ -e "$path" ] && ! grep -qx "$path" "$STATE/outside" 2>/dev/null && echo "path $path"
    done
    [ -e "$SOCK" ] && echo "socket $SOCK"
    true
}

on_exit() {  # of run: stop and clean up; anything left on the machine fails the run
    local code=$? stopping=$SECONDS
    trap - EXIT
    if [ -n "${STARTED:-}" ]; then
        stop || { [ "$code" -ne 0 ] || code=1; }
    fi
    say "timings: engine install+start $((t1 - t0)) s, command $((t2 - t1)) s, stop and clean-up $((SECONDS - stopping)) s"
    exit "$code"
}

run() {
    [ $# -gt 0 ] || die "run: no command"
    t0=$SECONDS t1=$SECONDS t2=$SECONDS status=0
    trap on_exit EXIT
    trap 'exit 130' INT TERM
    start
    t1=$SECONDS
    DOCKER_HOST="unix://$SOCK" DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0 "$@" || status=$?
    t2=$SECONDS
    exit "$status"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 start | stop | run COMMAND..." >&2; exit 2 ;;
esac
