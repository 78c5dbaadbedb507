#!/usr/bin/env bash
# The test suite as two pytest runs side by side: the real-engine tests (marker
# `engine`) one after another, and everything else. Two vLLM servers on two cores
# would only slow each other down; the rest (mostly waiting on subprocesses, Ray and
# databases) runs beside them. Each run has its own FARM_HOME below the caller's (or a
# fresh one): engine builds, the host's Ray cluster per FARM_HOME and logs never mix
# between tests running at the same time. Lines are prefixed with their run; the exit
# status is the first failing run's.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
base=${FARM_HOME:-$(mktemp -d /tmp/farm-test.XXXXXX)}
mkdir -p "$base/engine" "$base/rest"

# Subshells: `wait` then reports each pipeline's status (pipefail), not sed's.
(FARM_HOME="$base/engine" "$PYTEST" -m engine "$@" tests 2>&1 | sed -u 's/^/[engine] /') &
engine=$!
(FARM_HOME="$base/rest" "$PYTEST" -m "not engine" "$@" tests 2>&1 | sed -u 's/^/[rest]   /') &
rest=$!
wait "$rest"; rest_status=$?
wait "$engine"; engine_status=$?
echo "tests: rest exit $rest_status, engine exit $engine_status"
[ "$rest_status" -ne 0 ] && exit "$rest_status"
exit "$engine_status"
