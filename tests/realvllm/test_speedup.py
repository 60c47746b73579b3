"""The paired speed-up through real vLLM: a server without speculative decoding, then the n-gram
one, both with --enable-per-request-metrics, the same prompts through the exporter's proxy;
`compare` gives the speed-up with an interval from vLLM's own timing fields."""

from __future__ import annotations

import json

from clitools import CLI, free_port, process, wait_http, write_config

from realvllm import servers
from realvllm.conftest import ask, cli, post

TIMED = ("--enable-per-request-metrics",)
PROMPTS = [f"{i} the cat sat on the mat and the cat sat on the mat and the cat" for i in range(8)]


def _window(url: str, proxy: str, window: str, target: str) -> dict:
    post(f"{url}/api/v1/windows", {"id": window, "targets": [target]})
    for round_ in range(2):
        for i, prompt in enumerate(PROMPTS):
            ask(proxy, chat=False, stream=(i + round_) % 2 == 0, prompt=prompt)
    return json.loads(post(f"{url}/api/v1/windows/{window}/stop", {}))


def test_no_spec_against_ngram_gives_a_speedup_with_an_interval(tiny_model, tmp_path):
    ports = {"nospec": free_port(), "ngram": free_port()}
    proxies = {name: free_port() for name in ports}
    made = {"nospec": servers.RealVllm(tiny_model, ports["nospec"], None, TIMED,
                                       log=tmp_path / "nospec.log"),
            "ngram": servers.RealVllm(tiny_model, ports["ngram"], servers.ngram(3), TIMED,
                                      log=tmp_path / "ngram.log")}
    targets = [{"name": name, "url": made[name].metrics_url,
                "proxy": {"listen": f"127.0.0.1:{proxies[name]}"}} for name in ports]
    port = free_port()
    config = write_config(tmp_path / "c.yaml", port, targets, scrape_interval="1s",
                          scrape_timeout="1s")
    url = f"http://127.0.0.1:{port}"
    answers = {}
    with process(CLI + ["serve", "--config", str(config)]):
        wait_http(f"{url}/-/healthy", deadline=30)
        # One server at a time: the two share the machine's cores, as the runs of a paired
        # benchmark would not.
        for window, name in (("a", "nospec"), ("b", "ngram")):
            with servers.serving(made[name]):
                answers[window] = _window(url, f"http://127.0.0.1:{proxies[name]}", window, name)
        done = cli("compare", "a", "b", "--exporter", url, "--json", "--fail-if-slower=0.01")
    assert done.returncode == 0, done.stderr
    for window, answer in answers.items():
        timing = answer["per_request"]["aggregate"]["timing"]
        # vLLM timed every answer itself (its field names read), n = 1, usage asked for.
        assert timing["timed"] == timing["by_server"] == 2 * len(PROMPTS), window
        assert timing["tpot_ms"]["count"] == 2 * len(PROMPTS)
        assert timing["itl_ms"]["count"] > 0  # the proxy's chunk gaps of the streamed ones
    entry = json.loads(done.stdout)["speedup"]["aggregate"]
    rows = {(r["figure"], r["stat"]): r for r in entry["rows"]}
    up = rows["tokens_per_second", "mean"]["speedup"]
    assert up["low"] is not None and up["low"] <= up["value"] <= up["high"]
    assert rows["tpot_ms", "p50"]["speedup"]["low"] is not None
    # The speed-up's figures are the windows' own: B's mean over A's.
    a_mean = answers["a"]["per_request"]["aggregate"]["timing"]["tokens_per_second"]["mean"]
    b_mean = answers["b"]["per_request"]["aggregate"]["timing"]["tokens_per_second"]["mean"]
    assert up["value"] == b_mean / a_mean
    print(f"\nreal vLLM speed-up (tokens/s per request, mean): {up['value']:.3f} "
          f"[{up['low']:.3f}, {up['high']:.3f}]; rows: "
          + "; ".join(f"{f} {s} {r['speedup']['value']:.3f}" for (f, s), r in rows.items()))
