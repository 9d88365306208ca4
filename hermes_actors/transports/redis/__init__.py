"""Redis Streams transport between machines: the RedisRelayActor and its pieces."""
