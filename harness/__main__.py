"""`python -m harness` is the same program as the `dcpqual` console script."""

from harness.cli import main

raise SystemExit(main())
