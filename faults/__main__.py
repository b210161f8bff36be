"""`python -m faults`: see faults.runner."""

import sys

from faults.runner import main

sys.exit(main())
