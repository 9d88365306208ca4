"""Benchmark harness: hermes-actors against a model of the seed's design."""
