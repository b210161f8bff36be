"""mesh-provisioner: the mesh's provisioner seat over NATS JetStream.

`Config` is a whole configuration with every setting defaulted but the bus; `mesh_provisioner.runtime.Runtime`
runs the seat, alone or inside a larger actor runtime.
"""

from mesh_provisioner.config import Config

__all__ = ["Config"]
__version__ = "0.1.0"
