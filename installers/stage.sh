#!/usr/bin/env bash
# Runs one stage of `make test` (install, lint, types, contracts, pytest) and adds its wall time to
# build/stage-times.txt, which .ci/run prints at the end, passed or not. Usage: installers/stage.sh NAME COMMAND...
set -uo pipefail
name=$1
shift
mkdir -p build
start=$(date +%s)
"$@"
status=$?
printf '%-10s %5d s  %s\n' "$name" "$(( $(date +%s) - start ))" "$([ "$status" -eq 0 ] && echo ok || echo "failed ($status)")" \
  >> build/stage-times.txt
exit "$status"
