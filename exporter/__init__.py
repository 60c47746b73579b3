"""specdec-exporter: vLLM speculative-decoding counters, live and per benchmark window."""

__version__ = "0.1.0"
