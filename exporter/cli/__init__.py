"""The specdec-exporter command: sub-commands, measure, demo."""
