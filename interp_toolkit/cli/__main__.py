"""``python -m interp_toolkit.cli``: the same as the ``interp-toolkit`` command."""

import sys

from interp_toolkit.cli import main

sys.exit(main())
