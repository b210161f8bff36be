"""`python -m mesh_provisioner`: the seat process."""

import sys

from mesh_provisioner.cli import main

sys.exit(main())
