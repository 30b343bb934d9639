"""Several replicas, one resilience state: the Redis backend (docs/fleet.md).

Imported only when `[state] backend` names a Redis URL, so the SQLite default never loads the
Redis client.
"""

from proxy.fleet.backend import FleetState, FleetUnavailable

__all__ = ["FleetState", "FleetUnavailable"]
