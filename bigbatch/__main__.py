"""`python -m bigbatch …`: the `bigbatch` command, exit status included (how the launchers start ranks)."""

import sys

from bigbatch.command import main

if __name__ == "__main__":
    sys.exit(main())
