"""`python -m speck.codegen.cache info|verify|clear` (see speck.codegen.cache.cli)."""

import sys

from speck.codegen.cache.cli import main

sys.exit(main())
