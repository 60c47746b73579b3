"""Store answers that make no sense (issue 42's H2a-d and H4, then our own), each with what
the refusal must say: shared by the history route's and the CLI's tests."""

from __future__ import annotations

from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts_total"


def _matrix(result: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _drafts(values: list[Any], **labels: Any) -> dict[str, Any]:
    return {"metric": {"__name__": DRAFTS, "instance": "a:1", **labels},
            "values": [[100.0 + i, v] for i, v in enumerate(values)]}


TOO_BIG = str(2**53 - 1)
# (what the store answers, what the 502 must say): issue 42's H2a-d and H4, then our own.
HOSTILE_ANSWERS = [
    (_matrix([{"metric": ["a", "b"], "values": [[100.0, "1"]]}]), "result[0].metric is not"),
    (_matrix([{"metric": {"__name__": DRAFTS}, "values": "lots"}]), "result[0].values is not a"),
    (_matrix([_drafts(["1", "abc"])]), "at 101.0: 'abc' is not a count"),
    (_matrix([7]), "result[0] is not an object: 7"),
    (_matrix([_drafts(["10", "50", "5", "30", "3", "1e300"])]), "at 105.0: '1e300' is not a"),
    (_matrix([_drafts(["1"], instance=5)]), "result[0].metric is not an object of label"),
    (_matrix([{"metric": {"instance": "a"}, "values": []}]), "with a __name__"),
    (_matrix([{"metric": {"__name__": DRAFTS}, "values": [[100.0]]}]), "is not [time,"),
    (_matrix([{"metric": {"__name__": DRAFTS}, "values": [["soon", "1"]]}]), "is not [time,"),
    (_matrix([_drafts(["1", "-5"])]), "'-5' is not a count"),
    (_matrix([_drafts(["1", "+Inf"])]), "'+Inf' is not a count"),
    (_matrix({"a": 1}), "data.result is not a list"),
    ({"status": "success", "data": None}, "data is not a matrix"),
    ([1, 2], "answer is not a JSON object"),
    ({"status": "error", "error": "x" * 5000}, "query failed: " + "x" * 300),
    # Each sample a count, their reset-safe sum not: 2^53 - 1 twice after restarts.
    (_matrix([_drafts([TOO_BIG, "0", TOO_BIG, "0", TOO_BIG], model_name="m"),
              {**_drafts(["0", "0", "3", "0", "3"], model_name="m"),
               "metric": {"__name__": "vllm:spec_decode_num_draft_tokens_total",
                          "instance": "a:1", "model_name": "m"}}]),
     "increase.num_drafts adds up to 1.80144e+16, over 2^53"),
]
