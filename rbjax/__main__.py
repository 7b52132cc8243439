"""``python -m rbjax``: the command line (rbjax/_cli), the same as the ``rbjax`` script."""

import sys

from ._cli import main

sys.exit(main())
