"""Federated vectorized environments and adapters to other RL libraries."""
