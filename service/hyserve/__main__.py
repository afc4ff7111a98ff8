from hyserve.cli import main

raise SystemExit(main())
