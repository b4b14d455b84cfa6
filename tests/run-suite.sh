#!/usr/bin/env bash
# `make test`: the whole suite, none skipped, in as little wall time as 2 cores allow.
#
#  1. In the background from the start (niced): lint, Slurm 25.11 + pyslurm from source, and
#     the docker engine + the docker cluster's image. Warm, the builds are cache hits in seconds.
#  2. The suite on TEST_WORKERS pytest-xdist workers when more than 1 (--dist loadgroup: tests
#     sharing one cluster fixture stay on one worker, tests/conftest.py). A build that has
#     ended within BUILD_GRACE_S (warm: a cache hit) has its tests (25.11, docker) in that run;
#     one still building (cold) has them after the run, once it has ended: a build still
#     running would otherwise count against the first such test's timeout.
#  3. Lint's result: its output and a failed run when it failed.
#
# A background build that fails is shown with its log's tail; the fixtures of the tests that
# need it build it again and fail with the error, so a broken build is never a skipped test.
# A failed test gets one rerun (pytest-rerunfailures); a pass on rerun is listed under
# "FLAKY" at the end. A test that fails twice fails the run. Exit status: the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=$VENV/bin/python
WORKERS=${TEST_WORKERS:-1}
LOGS=.make/logs
mkdir -p "$LOGS"

pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    for p in "${pids[@]}"; do # only our own background builds (each its own process group)
        kill -- "-$p" 2>/dev/null || true
    done
    if [ "${engine_started:-0}" = 1 ]; then
        "$PY" docker/cluster.py daemon-down >/dev/null 2>&1 || echo "warning: dockerd not stopped"
    fi
}
trap cleanup EXIT

background() { # name, command...: run niced in the background, output to $LOGS/name.log
    local name=$1
    shift
    setsid nice -n 5 "$@" >"$LOGS/$name.log" 2>&1 &
    pids+=("$!")
    echo "background: $name (log $LOGS/$name.log)"
}

warn_if_failed() { # pid name: a failed background build is shown, not hidden; the tests
    # that need it build it again in the foreground (fixtures) and fail with its error
    if ! wait "$1"; then
        echo "WARNING: background $2 failed; last lines of $LOGS/$2.log:" >&2
        tail -n 30 "$LOGS/$2.log" >&2
    fi
}

engine_started=0
if "$PY" -c 'import importlib.util as u, sys
spec = u.spec_from_file_location("t", "docker/cluster.py"); m = u.module_from_spec(spec)
spec.loader.exec_module(m); sys.exit(0 if m.engine_ok() else 1)' 2>/dev/null; then
    echo "docker engine already running: used, left running"
else
    engine_started=1
fi

t0=$SECONDS
# shellcheck disable=SC2016  # expanded by the inner bash
background lint bash -c 'make --no-print-directory lint VENV="$1" && echo "lint ok ($SECONDS s)"' \
    lint "$VENV"
lint=${pids[-1]}
background slurm2511 "$PY" -m babysitter.devcluster.source --pyslurm
build_2511=${pids[-1]}
background docker-image "$PY" docker/cluster.py image
build_image=${pids[-1]}

deadline=$((t0 + ${BUILD_GRACE_S:-30}))
ended() { # pid name: the background build has ended by the deadline (a failure is shown)
    local left=$((deadline - SECONDS))
    [ "$left" -gt 0 ] || left=1
    timeout "$left" tail --pid="$1" -s 0.2 -f /dev/null || return 1
    warn_if_failed "$1" "$2"
}
later=() # markers of the tests whose build is still running: run after the suite
ended "$build_2511" slurm2511 || later+=(slurm2511)
ended "$build_image" docker-image || later+=(docker)
echo "builds ended within the grace: the suite runs all but: ${later[*]:-none} ($((SECONDS - t0)) s)"

parallel=()
[ "$WORKERS" -lt 2 ] || parallel=(-n "$WORKERS" --dist loadgroup)
status=0
fail() { # keep the first failure's status; 5 (no test selected by a marker) is not a failure
    [ "$1" = 5 ] || [ "$status" != 0 ] || status=$1
}
marks=""
for m in "${later[@]}"; do marks+="${marks:+ and }not $m"; done
select=()
[ -z "$marks" ] || select=(-m "$marks")
"$VENV/bin/pytest" "${parallel[@]}" --reruns 1 --durations=20 "${select[@]}" "$@" || fail $?
echo "suite${marks:+ ($marks)}: exit $status ($((SECONDS - t0)) s)"

if [[ " ${later[*]} " == *" slurm2511 "* ]]; then
    warn_if_failed "$build_2511" slurm2511
    "$VENV/bin/pytest" "${parallel[@]}" --reruns 1 -m "slurm2511 and not docker" "$@" || fail $?
    echo "Slurm 25.11 tests: done ($((SECONDS - t0)) s)"
fi
if [[ " ${later[*]} " == *" docker "* ]]; then
    warn_if_failed "$build_image" docker-image
    "$VENV/bin/pytest" --reruns 1 -m docker "$@" || fail $?
    echo "docker tests: done ($((SECONDS - t0)) s)"
fi

if wait "$lint"; then
    tail -n 1 "$LOGS/lint.log"
else
    fail 1
    echo "LINT FAILED; its output ($LOGS/lint.log):" >&2
    cat "$LOGS/lint.log" >&2
fi
pids=()
exit "$status"
