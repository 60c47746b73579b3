"""Entry point for `python -m exporter`."""

from exporter.cli.main import main

raise SystemExit(main())
