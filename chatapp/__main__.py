"""Allow `python -m chatapp`."""

from chatapp.cli import main

raise SystemExit(main())
