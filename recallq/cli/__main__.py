"""`python -m recallq.cli`, as the `recallq` command."""

from recallq.cli import script

script()
