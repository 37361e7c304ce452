"""`python -m slurmdist` is the `slurmdist` command."""

from .cli import main

raise SystemExit(main())
