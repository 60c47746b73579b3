"""`compare` and `advise` through the real CLI in a subprocess.

Against a real exporter app on a loopback port over two fake vLLM servers whose windows have
known, different acceptance; and against result folders written in AISBench's exact format.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path

import pytest

from exporter.analysis.stats import Z

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "exporter"]


async def run_cli(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the CLI; async so the in-process exporter keeps serving."""
    process = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode, out.decode(), err.decode()


async def record(exporter, targets, window_id: str, per_pos: list[int], drafts: int = 1000):
    """One window in which every target gets `drafts` drafts with these per-position counts."""
    await exporter.start(id=window_id)
    for target in targets:
        target.server.add(0, drafts, drafts * len(per_pos), per_pos)
    await exporter.stop(window_id)


@pytest.fixture
async def two_windows(fake_vllm, exporter):
    """Exporter URL, with stopped windows `wa` (p = .8 .5 .2) and `wb` (p = .7 .4 .1)."""
    targets = [await fake_vllm(k=3), await fake_vllm(k=3)]
    under_test = await exporter({"targets": [
        {"name": f"t{i}", "url": t.url} for i, t in enumerate(targets)]})
    await record(under_test, targets, "wa", [800, 500, 200])
    await record(under_test, targets, "wb", [700, 400, 100])
    return str(under_test.client.make_url("")).rstrip("/")


class TestCompareWindows:
    async def test_json_verdicts_and_intervals(self, two_windows):
        code, out, err = await run_cli("compare", "wa", "wb", "--exporter", two_windows, "--json")
        assert code == 0, err
        body = json.loads(out)
        assert set(body["targets"]) == {"t0", "t1"}
        for entry in [*body["targets"].values(), body["aggregate"]]:
            rows = {r["metric"]: r for r in entry["metrics"]}
            length = rows["acceptance_length"]
            assert length["a"]["value"] == pytest.approx(2.5)
            assert length["b"]["value"] == pytest.approx(2.2)
            assert length["verdict"] == "worse"
            assert rows["position_2"]["verdict"] == "worse"
        # One target: 1000 drafts each side, Var X = 1.05 (A) and 0.96 (B).
        t0 = {r["metric"]: r for r in body["targets"]["t0"]["metrics"]}
        se = math.sqrt(1.05 / 1000 + 0.96 / 1000)
        assert t0["acceptance_length"]["difference"]["low"] == pytest.approx(-0.3 - Z * se)
        # The aggregate has twice the drafts: a narrower interval.
        agg = {r["metric"]: r for r in body["aggregate"]["metrics"]}
        assert agg["acceptance_length"]["difference"]["low"] == pytest.approx(
            -0.3 - Z * se / math.sqrt(2))
        assert body["tripped"] is False and body["gates"] == []

    async def test_reversed_is_better(self, two_windows):
        code, out, _ = await run_cli("compare", "wb", "wa", "--exporter", two_windows)
        assert code == 0
        assert "[t0]" in out and "[all]" in out
        length_lines = [line for line in out.splitlines() if line.startswith("acceptance length")]
        assert len(length_lines) == 3 and all(line.endswith("better") for line in length_lines)

    @pytest.mark.parametrize(
        ("gate", "code"),
        [("acceptance_length=2%", 1), ("acceptance_length=20%", 0),
         ("acceptance_rate=5", 1), ("acceptance_rate=15", 0)],  # rate 50% -> 40%
    )
    async def test_fail_if_worse(self, two_windows, gate, code):
        got, out, err = await run_cli("compare", "wa", "wb", "--exporter", two_windows,
                                      "--fail-if-worse", gate)
        assert got == code, out + err
        assert ("gates: tripped" in out) is (code == 1)
        # B is worse everywhere here: a gate within its limit still says so, as "pass".
        assert f"{'FAIL' if code else 'pass'} {gate} [all]: B is worse by" in out

    async def test_unknown_window_is_a_usage_error(self, two_windows):
        code, _, err = await run_cli("compare", "wa", "nope", "--exporter", two_windows)
        assert code == 2 and "'nope'" in err and "404" in err

    async def test_open_window_is_a_usage_error(self, two_windows):
        from exporter.client import ExporterClient

        await asyncio.to_thread(ExporterClient(two_windows).start, "wopen")
        code, out, err = await run_cli("advise", "wopen", "--exporter", two_windows)
        assert code == 2 and out == "" and "still open" in err

    async def test_advise(self, two_windows):
        code, out, err = await run_cli("advise", "wa", "--exporter", two_windows, "--json",
                                       "--draft-cost", "0.25")
        assert code == 0, err
        body = json.loads(out)
        advice = body["results"]["t0"]
        assert [r["length"] for r in advice["rows"]] == pytest.approx(
            [1.8, 2.3, 2.5, 2.6, 2.65, 2.675])  # tail ratio sqrt(0.2 / 0.8) = 0.5
        assert advice["best"]["0.25"]["k"] == 2
        code, out, _ = await run_cli("advise", "wa", "--exporter", two_windows)
        assert code == 0
        assert "Speculation advisor  [t0]" in out and "Speculation advisor  [all]" in out
        assert "ratio 0.5000" in out


def aisbench_result(drafts: int, per_pos: list[int], url: str) -> dict:
    """A RESULT exactly as AISBench's save_spec_decode_result writes it (full precision)."""
    k = len(per_pos)
    accepted = sum(per_pos)
    before = {"num_drafts": 100, "num_draft_tokens": 100 * k, "num_accepted_tokens": 50,
              "accepted_per_pos": {str(i): 10 for i in range(k)}}
    return {
        "status": "ok", "url": url, "error": None,
        "data": {
            "num_drafts": drafts, "draft_tokens": drafts * k, "accepted_tokens": accepted,
            "acceptance_rate": accepted / (drafts * k) * 100,
            "acceptance_length": 1 + accepted / drafts,
            "per_position_acceptance_rates": {str(i): c / drafts for i, c in enumerate(per_pos)},
        },
        "raw": {"before": before, "after": {
            "num_drafts": 100 + drafts, "num_draft_tokens": 100 * k + drafts * k,
            "num_accepted_tokens": 50 + accepted,
            "accepted_per_pos": {str(i): 10 + c for i, c in enumerate(per_pos)}}},
    }


def write_run(root: Path, servers: dict[str, tuple[int, list[int]]]) -> Path:
    performances = root / "performances"
    performances.mkdir(parents=True)
    for host_port, (drafts, per_pos) in servers.items():
        key = host_port.replace(":", "_")
        result = aisbench_result(drafts, per_pos, f"http://{host_port}/metrics")
        # indent=2, as AISBench's json.dump does.
        (performances / f"spec_decode_{key}.json").write_text(json.dumps(result, indent=2))
    return root


class TestCompareFolders:
    @pytest.fixture
    def runs(self, tmp_path):
        a = write_run(tmp_path / "a", {"10.0.0.1:8080": (15420, [10583, 7257, 5341, 2922, 1411]),
                                       "10.0.0.2:8080": (2000, [1500, 1000, 500, 250, 100])})
        b = write_run(tmp_path / "b", {"10.0.0.1:8080": (15000, [9800, 6500, 4700, 2700, 1300]),
                                       "10.0.0.3:8080": (2000, [1500, 1000, 500, 250, 100])})
        return a, b

    async def test_json(self, runs):
        code, out, err = await run_cli("compare", str(runs[0]), str(runs[1]), "--json")
        assert code == 0, err
        body = json.loads(out)
        assert list(body["targets"]) == ["10.0.0.1:8080"]
        assert body["only_in_a"] == ["10.0.0.2:8080"] and body["only_in_b"] == ["10.0.0.3:8080"]
        rows = {r["metric"]: r for r in body["targets"]["10.0.0.1:8080"]["metrics"]}
        assert rows["acceptance_length"]["a"]["value"] == pytest.approx(1 + 27514 / 15420)
        assert rows["acceptance_length"]["verdict"] == "worse"
        # A's aggregate: both of A's servers summed, then divided.
        agg = {r["metric"]: r for r in body["aggregate"]["metrics"]}
        assert agg["acceptance_length"]["a"]["value"] == pytest.approx(
            1 + (27514 + 3350) / 17420)

    async def test_fail_if_worse_exit_codes(self, runs):
        a, b = map(str, runs)
        tripped = await run_cli("compare", a, b, "--fail-if-worse", "acceptance_length=1%")
        assert tripped[0] == 1 and "FAIL acceptance_length=1% [10.0.0.1:8080]" in tripped[1]
        # Same folder on both sides: nothing significant, nothing trips.
        same = await run_cli("compare", a, a, "--fail-if-worse", "acceptance_length=0%")
        assert same[0] == 0 and "gates: passed" in same[1]

    @pytest.mark.parametrize(
        ("args", "message"),
        [(["compare", "{a}", "{missing}"], "no such directory"),
         (["compare", "{a}", "{a}", "--fail-if-worse", "speed=2%"], "unknown metric"),
         (["compare", "{a}", "{a}", "--fail-if-worse", "acceptance_length"], "METRIC=LIMIT"),
         (["compare", "{a}", "{empty}"], "no performances/spec_decode_*.json"),
         (["compare", "{a}", "{broken}"], "not valid JSON"),
         (["compare", "{a}", "{nan}"], "finite numbers"),
         (["compare", "{a}"], "required"),
         (["advise", "{a}", "--draft-cost", "-1"], "draft cost")],
    )
    async def test_usage_errors_exit_2(self, runs, tmp_path, args, message):
        (tmp_path / "empty").mkdir()
        broken = tmp_path / "broken" / "performances"
        broken.mkdir(parents=True)
        (broken / "spec_decode_x_1.json").write_text('{"status": "ok", "data": {')
        nan = write_run(tmp_path / "nan", {"h:1": (10, [5])})
        (path,) = (nan / "performances").glob("*.json")
        path.write_text(path.read_text().replace('"0": 0.5', '"0": NaN'))
        paths = {"a": runs[0], "missing": tmp_path / "missing", "empty": tmp_path / "empty",
                 "broken": tmp_path / "broken", "nan": nan}
        code, out, err = await run_cli(*[arg.format(**paths) for arg in args])
        assert code == 2 and out == ""
        assert message in err

    async def test_advise_with_nothing_to_advise_exits_1(self, tmp_path):
        performances = tmp_path / "na" / "performances"
        performances.mkdir(parents=True)
        (performances / "spec_decode_h_1.json").write_text(json.dumps(
            {"status": "na", "url": "http://h:1/metrics",
             "error": "No spec decode metrics found on server", "data": None,
             "raw": {"before": None, "after": None}}, indent=2))
        code, out, _ = await run_cli("advise", str(tmp_path / "na"))
        assert code == 1 and "nothing to advise" in out

    async def test_advise_folder(self, runs):
        code, out, err = await run_cli("advise", str(runs[0]))
        assert code == 0, err
        assert "Speculation advisor  [10.0.0.1:8080]" in out
        assert "Speculation advisor  [all]" in out
        code, out, _ = await run_cli("advise", str(runs[0]), "--json", "--draft-cost", "0.1")
        rows = json.loads(out)["results"]["10.0.0.2:8080"]["rows"]
        assert rows[0]["speedup"]["0.1"] == pytest.approx(1.75 / 1.1)
