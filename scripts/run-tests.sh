#!/usr/bin/env bash
# The test suite as two pytest runs side by side: the real-engine tests (marker
# `engine`) one after another, and everything else. Two vLLM servers on two cores
# would only slow each other down (tried: two engine runs beside the rest ran a
# selftest cell in 3.6 minutes instead of about 50 s, and the rest was at 14% after 22
# minutes). The rest (mostly waiting on subprocesses, Ray and databases) runs beside
# the one engine run. Each run has its own FARM_HOME below the caller's (or a
# fresh one): the host's Ray cluster per FARM_HOME and logs never mix between tests
# running at the same time; the build cache is shared. Lines are prefixed with their
# run; the exit status is the first failing run's. A failing run's short summary is
# printed again at the very end: a CI log that keeps only its tail still names what
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
base=${FARM_HOME:-$(mktemp -d /tmp/farm-test.XXXXXX)}
mkdir -p "$base/engine/cache" "$base/rest"
# One build cache for both runs: the vLLM CPU build both need is made once (its lock
# holds the second run until the first has built it), not twice at once on two cores.
[ -e "$base/rest/cache" ] || ln -s ../engine/cache "$base/rest/cache"

# Subshells: `wait` then reports each pipeline's status (pipefail), not sed's.
(FARM_HOME="$base/engine" "$PYTEST" -m engine "$@" tests 2>&1 \
    | tee "$base/engine.log" | sed -u 's/^/[engine] /') &
engine=$!
# The rest run builds the harnesses' own environments first (AISBench, evalscope: about
# 3 minutes from the package index), while the engine run builds vLLM and bisects; the
# engine run's harness test then finds them ready instead of building on its clock.
harness_envs=tests/integration/test_harness_envs.py
# One pytest process for the rest: on three pytest-xdist workers (tests/conftest.py
# gives each its own farm home; `-n 3 --dist loadfile` by hand) it took 740 s instead
# of 1,187 s, but the engine run, the longer chain, took 2,236-2,253 s beside it
# instead of 1,969 s.
rest_tests() {
    "$PYTEST" -m "not engine" "$@" "$harness_envs"; first=$?
    "$PYTEST" -m "not engine" "$@" --ignore="$harness_envs" tests; others=$?
    [ "$first" -ne 0 ] && return "$first"
    return "$others"
}
# The rest yields the cores to the engine run at niceness 19.
(renice -n 19 -p "$BASHPID" >/dev/null; FARM_HOME="$base/rest" rest_tests "$@" 2>&1 \
    | tee "$base/rest.log" | sed -u 's/^/[rest]   /') &
rest=$!
wait "$rest"; rest_status=$?
wait "$engine"; engine_status=$?
for run in rest engine; do
    status_var="${run}_status"
    if [ "${!status_var}" -ne 0 ]; then
        echo "=== $run run failed (exit ${!status_var}); its summary ($base/$run.log):"
        sed -n '/short test summary info/,$p' "$base/$run.log" | tail -n 60
    fi
done
echo "tests: rest exit $rest_status, engine exit $engine_status"
[ "$rest_status" -ne 0 ] && exit "$rest_status"
exit "$engine_status"
