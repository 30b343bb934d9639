"""What every replica of a fleet must agree on: providers, connections and combos.

Two replicas that route the same name to different upstreams, or count a connection the other
does not have, would share breakers and cooldowns that mean different things. So each replica
publishes a digest per item of its config; a replica whose items differ from the fleet's refuses
to start, naming the items that differ (never their content: a connection's digest covers its
credential's fingerprint, not the key).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from proxy.config import Config


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_items(config: Config) -> dict[str, str]:
    """`provider:<id>`, `connection:<id>`, `combo:<name>` -> a digest of what routing reads of it."""
    items: dict[str, str] = {}
    for provider in config.providers.values():
        items[f"provider:{provider.id}"] = _digest(
            {
                "class": provider.provider_class,
                "base_url": provider.base_url,
                "per_model_quota": provider.per_model_quota,
                "rate_limit": provider.rate_limit,
                "apis": sorted(provider.apis),
                "auth": provider.auth,
                "restate": [repr(rule) for rule in provider.restate],
                "headers": sorted(provider.headers),
            }
        )
        for c in provider.connections:
            items[f"connection:{c.id}"] = _digest(
                {
                    "provider": c.provider,
                    "priority": c.priority,
                    "max_concurrent": c.max_concurrent,
                    "enabled": c.enabled,
                    "disable_cooling": c.disable_cooling,
                    "credential": c.fingerprint(),
                }
            )
    for combo in config.combos.values():
        items[f"combo:{combo.name}"] = _digest({"strategy": combo.strategy, "targets": list(combo.targets)})
    items["server:default_combo"] = _digest(config.server.default_combo)
    return items


def fingerprint(items: Mapping[str, str]) -> str:
    return _digest(sorted(items.items()))


def differences(mine: Mapping[str, str], fleet: Mapping[str, str]) -> list[str]:
    """Each item that differs, in words: `connection key-b differs`, `combo fast only in this replica`."""
    found: list[str] = []
    for name in sorted(set(mine) | set(fleet)):
        kind, _, ident = name.partition(":")
        label = f"{kind} {ident}"
        if name not in fleet:
            found.append(f"{label} only in this replica")
        elif name not in mine:
            found.append(f"{label} only in the fleet")
        elif mine[name] != fleet[name]:
            found.append(f"{label} differs")
    return found
