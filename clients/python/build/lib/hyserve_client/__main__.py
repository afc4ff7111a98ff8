"""`python -m hyserve_client ...`: see hyserve_client.cli."""

from hyserve_client.cli import main

raise SystemExit(main())
