"""`python -m recallq.cli`, as the `recallq` command."""

import sys

from recallq.cli import main

sys.exit(main())
