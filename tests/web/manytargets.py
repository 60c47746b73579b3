"""Many vLLM-like targets behind one loopback server: `python manytargets.py PORT COUNT`.

Target i answers `/target-{i:04d}/metrics` with V1 spec-decode counters of g*(i+1) drafts
(k=3: 3 draft tokens a draft, 2 accepted, one at each of positions 0 and 1); `POST /grow`
adds one to g. One process serves all of them: a shard test needs hundreds of targets, not
hundreds of processes.
"""

from __future__ import annotations

import sys

from aiohttp import web

SERIES = (
    '# TYPE vllm:spec_decode_num_drafts counter\n'
    'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}\n'
    '# TYPE vllm:spec_decode_num_draft_tokens counter\n'
    'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}\n'
    '# TYPE vllm:spec_decode_num_accepted_tokens counter\n'
    'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}\n'
    '# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",'
    'position="0"}} {drafts}\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",'
    'position="1"}} {drafts}\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",'
    'position="2"}} 0\n'
)


def name(i: int) -> str:
    """The config name (and path) of target i."""
    return f"target-{i:04d}"


def make_app(count: int) -> web.Application:
    """The server of `count` targets."""
    grown = [0]

    async def page(request: web.Request) -> web.Response:
        i = int(request.match_info["i"])
        if i >= count:
            raise web.HTTPNotFound()
        drafts = grown[0] * (i + 1)
        text = SERIES.format(drafts=drafts, tokens=3 * drafts, accepted=2 * drafts)
        return web.Response(text=text, content_type="text/plain")

    async def grow(_request: web.Request) -> web.Response:
        grown[0] += 1
        return web.json_response({"grown": grown[0]})

    app = web.Application()
    app.router.add_get(r"/target-{i:\d+}/metrics", page)
    app.router.add_post("/grow", grow)
    return app


if __name__ == "__main__":
    web.run_app(make_app(int(sys.argv[2])), host="127.0.0.1", port=int(sys.argv[1]),
                print=None)
