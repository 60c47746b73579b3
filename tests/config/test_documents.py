"""Documents from outside read within limits: depth, values (aliases at each use), size."""

from __future__ import annotations

import pytest

from exporter.config.documents import DocumentError, check_bounds, parse_json, parse_yaml
from exporter.config.model import load_config
from exporter.core.errors import ConfigError


def laughs(levels: int = 9) -> str:
    lines = ['- &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"- &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


class TestBounds:
    def test_billion_laughs_is_refused_before_anything_walks_it(self):
        assert len(laughs()) < 1000
        with pytest.raises(DocumentError, match="values"):
            parse_yaml(laughs())

    def test_a_few_aliases_are_fine(self):
        data = parse_yaml(laughs(2))
        assert data[2][0][0][0] == "lol"

    @pytest.mark.parametrize("depth", [100, 100_000])
    def test_deep_json_is_refused(self, depth):
        with pytest.raises(DocumentError, match="nested"):
            parse_json("[" * depth + "]" * depth)

    def test_deep_yaml_is_refused(self):
        with pytest.raises(DocumentError, match="nested"):
            parse_yaml("[" * 100_000 + "]" * 100_000)

    def test_ordinary_documents_pass(self):
        groups = [{"targets": [f"h:{i}"], "labels": {"a": "b"}} for i in range(5000)]
        check_bounds(groups)
        assert parse_json('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}

    def test_invalid_text_says_where(self):
        with pytest.raises(DocumentError, match="invalid YAML at line 1"):
            parse_yaml("a: [")
        with pytest.raises(DocumentError, match="not valid JSON"):
            parse_json("[{")


class TestConfigFile:
    def test_billion_laughs_config_is_a_config_error(self, tmp_path):
        path = tmp_path / "c.yaml"
        path.write_text("targets:\n" + "".join(f"  {line}\n" for line in laughs().splitlines()))
        with pytest.raises(ConfigError, match=r"\(yaml\): over .* values"):
            load_config(path)

    def test_oversized_config_keeps_its_hint(self, tmp_path):
        path = tmp_path / "c.yaml"
        path.write_text("#" * (1024 * 1024 + 1))
        with pytest.raises(ConfigError, match="put large target lists in file_sd"):
            load_config(path)
