#!/usr/bin/env bash
# The test suite as three pytest runs side by side: the real-engine tests (marker
# `engine`) in two runs of whole modules, each one server at a time, and everything
# else. Most of an engine server's start is single-threaded Python imports in its
# three processes: one run leaves a third of two cores idle, two side by side served
# 1.6 times the cells per minute (measured: two one-cell sweeps at once 98 s, one
# alone 78 s). The rest (mostly waiting on subprocesses, Ray and databases) runs
# beside them. Each run has its own FARM_HOME below the caller's (or a fresh one):
# the host's Ray cluster per FARM_HOME and logs never mix between tests running at the
# same time; the two engine runs share one build cache (builds are locked while made,
# so the first to need a build makes it and the other waits). Lines are prefixed with
# their run; the exit status is the first failing run's. A failing run's short summary
# is printed again at the very end: a CI log that keeps only its tail still names
# what failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
base=${FARM_HOME:-$(mktemp -d /tmp/farm-test.XXXXXX)}
mkdir -p "$base/engine/cache" "$base/engine2" "$base/rest"
[ -e "$base/engine2/cache" ] || ln -s ../engine/cache "$base/engine2/cache"

# The second engine run's modules, about half the engine time (farm selftest is the
# largest); every other engine module, a new one included, runs in the first.
second=(
    tests/integration/test_selftest.py
    tests/integration/test_sweep_engine.py
    tests/integration/test_pr_engine.py
    tests/integration/test_harness_engine.py
    tests/integration/test_engine_failures.py
    tests/integration/test_gdn_canary.py
)
ignore=()
for module in "${second[@]}"; do ignore+=(--ignore "$module"); done

# Subshells: `wait` then reports each pipeline's status (pipefail), not sed's.
run() {  # name, FARM_HOME folder, pytest arguments...
    local name=$1 home=$2
    shift 2
    (FARM_HOME="$base/$home" "$PYTEST" "$@" 2>&1 \
        | tee "$base/$name.log" | sed -u "s/^/[$name] /")
}
run engine engine -m engine "${ignore[@]}" "$@" tests &
engine=$!
run engine2 engine2 -m engine "$@" "${second[@]}" &
engine2=$!
run rest rest -m "not engine" "$@" tests &
rest=$!
wait "$rest"; rest_status=$?
wait "$engine"; engine_status=$?
wait "$engine2"; engine2_status=$?
for name in rest engine engine2; do
    status_var="${name}_status"
    if [ "${!status_var}" -ne 0 ]; then
        echo "=== $name run failed (exit ${!status_var}); its summary ($base/$name.log):"
        sed -n '/short test summary info/,$p' "$base/$name.log" | tail -n 60
    fi
done
echo "tests: rest exit $rest_status, engine exit $engine_status, engine2 exit $engine2_status"
for status in "$rest_status" "$engine_status" "$engine2_status"; do
    [ "$status" -ne 0 ] && exit "$status"
done
exit 0
