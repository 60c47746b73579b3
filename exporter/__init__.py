"""specdec-exporter: speculative-decoding counters of vLLM servers, live and per benchmark window."""

__version__ = "0.1.0"
