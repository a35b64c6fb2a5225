"""``python -m tests.fuzz``, from the repository root: the differential fuzzer's command line
(cli.py)."""

from .cli import main

raise SystemExit(main())
