"""`python -m bench`: run the suite, print the table, write bench/results/latest.json."""

from bench.run import main

raise SystemExit(main())
