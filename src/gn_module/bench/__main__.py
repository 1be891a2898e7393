"""`python -m gn_module.bench`: see gn_module.bench.cli."""

import sys

from gn_module.bench.cli import main

sys.exit(main())
