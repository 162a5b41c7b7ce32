"""``python -m asyncrl.report RUN_DIR [--out FILE]``: the same command as ``asyncrl report``."""

import sys

from asyncrl.report.cli import main

sys.exit(main())
