#!/usr/bin/env bash
# `make test`: lint, types, then every test against the real stack. Starts the stack
# when it is not running and stops it at the end only if this script started it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
started=$(date +%s)

# A Debian package the tests need: installed with apt when missing (as root).
need() {
  command -v "$1" >/dev/null && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing $1 (Debian package)"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null
  else
    echo "$1 is missing: sudo apt-get install -y $1" >&2
    exit 2
  fi
}
need kcat      # the third-party reader the tests check the wire format with
need chromium  # the browser the UI test drives with Playwright (no downloaded build)

echo "== lint and types ($(date +%T))"
$BIN/ruff format --check .
$BIN/ruff check .
$BIN/mypy es_agents projectors examples tests
$BIN/es-agents schemas check
echo "== documentation site, strict ($(date +%T))"
NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $BIN/mkdocs build --strict --quiet

was_up=0
$BIN/es-agents dev status >/dev/null 2>&1 && was_up=1
stop_stack() {
  if [ "$was_up" = 0 ]; then
    echo "== stopping the dev stack"
    $BIN/es-agents dev down || true
  fi
}
trap stop_stack EXIT

echo "== dev stack ($(date +%T))"
$BIN/es-agents dev up

# Three test processes (pytest-xdist): most integration tests wait on brokers,
# timers and workers (the two cores were 40 % busy with one process), so three share
# them (tests serially ~22 minutes, in two processes ~13, in three 8-10). A test that
# stops a shared service is marked serial and runs alone afterwards.
# The browser test saves the web UI's pages into the tutorials' screenshots.
export ES_AGENTS_UI_SCREENSHOTS="${ES_AGENTS_UI_SCREENSHOTS:-$PWD/docs/screenshots}"
# A test stuck past 540 s leaves its threads' stacks here (tests/conftest.py).
export ES_AGENTS_TEST_STACKS="$PWD/.test-stacks"
rm -rf "$ES_AGENTS_TEST_STACKS"
echo "== tests ($(date +%T))"
status=0
$BIN/python -m pytest -p no:cacheprovider -o console_output_style=classic --durations=15 \
  -n "${ES_AGENTS_TEST_PROCESSES:-3}" -m "not serial" tests "$@" || status=$?
echo "== tests that stop a shared service, alone ($(date +%T))"
$BIN/python -m pytest -p no:cacheprovider -o console_output_style=classic \
  -m serial tests "$@" || status=$?
if [ "$status" != 0 ]; then
  for stuck in "$ES_AGENTS_TEST_STACKS"/*.txt; do
    [ -e "$stuck" ] && { echo "== stuck: $stuck"; cat "$stuck"; }
  done
  echo "tests failed (exit $status)"
  exit "$status"
fi

# The benchmarks, short: each prints its figures and one JSON line; nothing here
# asserts a time (the README's Performance section has the full-size figures).
echo "== benches (short versions) ($(date +%T))"
$BIN/es-agents bench steps --steps 100
$BIN/es-agents bench throughput --runs 1,10 --steps 10
$BIN/es-agents bench growth --chat-steps 200 --tool-calls 10 --resumes 2
$BIN/es-agents bench idle --paused 200 --idle 1 --timers 2000 --rate 1000
$BIN/es-agents bench takeover --paused 100 --active 10 --session-timeout 6000 --approvals 2

# Last, since they kill and restart the broker and Postgres: a seeded chaos run of at
# most ~2.5 minutes (60 s of faults, a heal of at most 60 s) on each store. Exit 1 on
# any violation.
echo "== chaos (seeded), Kafka store ($(date +%T))"
$BIN/es-agents bench chaos --minutes 1 --seed 42 --heal-seconds 60
echo "== chaos (seeded), Postgres store: the broker's faults restart Postgres instead ($(date +%T))"
ES_AGENTS_STORE=postgres $BIN/es-agents bench chaos --minutes 1 --seed 42 --heal-seconds 60
echo "make test took $(( $(date +%s) - started ))s"
