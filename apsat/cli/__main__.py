"""`python -m apsat.cli ...`: the `apsat` command."""
import sys

from apsat.cli import main

sys.exit(main())
