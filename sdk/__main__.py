"""`python -m duetaspan` runs the command line."""

import sys

from duetaspan.cli import main

sys.exit(main())
