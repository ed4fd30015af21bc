# Shared by the .ci scripts that install tensorops into throwaway virtual environments
# (.ci/protobuf-range, .ci/install-orders); sourced, not run. Sets $work (a temporary
# directory removed on exit) and $wheel (tensorops built once into it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/tensorops-$(basename "$0").XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS

step() { echo "== [$((SECONDS - start))s] $*"; }

# pip, quiet, without the machine's notes about missing local indexes
quiet_pip() {  # interpreter, pip arguments; fails when pip does
    local python=$1 out rc=0
    shift
    out=$("$python" -m pip -q "$@" 2>&1) || rc=$?
    [[ -z $out ]] || grep -v "^WARNING: Location" <<<"$out" || true
    return $rc
}

version() {  # venv, distribution name
    "$1/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$2"
}

newest() {  # package [version prefix]: its newest release on the index (whose version starts so)
    "$PYTHON" -m pip index versions "$1" 2>/dev/null | sed -n 's/^Available versions: //p' | tr -d ',' |
        tr ' ' '\n' | grep "^${2:-}" | head -1
}

step "building the wheel"
quiet_pip "$PYTHON" wheel --no-deps . -w "$work/wheels"
wheel=$(ls "$work"/wheels/tensorops-*.whl)
