"""The file relay (Desktop-compatible): the RelayActor, the relay hub and the Desktop RPC operations."""
