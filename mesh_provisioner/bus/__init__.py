"""NATS: the connection and its event loop, the watched cache, compare-and-set writes, the asks channel."""
