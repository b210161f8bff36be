"""The seat's actors: one per node, one per provider's bound bucket, and one asker."""
