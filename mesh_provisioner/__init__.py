"""mesh-provisioner: the mesh's provisioner seat over NATS JetStream."""
