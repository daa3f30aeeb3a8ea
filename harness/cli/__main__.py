"""``python -m harness.cli``: the ``txchaos`` command line."""

import sys

from harness.cli import main

sys.exit(main())
