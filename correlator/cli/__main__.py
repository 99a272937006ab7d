"""`python -m correlator.cli`: the same as the `rootrank` command."""

import sys

from correlator.cli import main

sys.exit(main())
