"""The two-provider config the integration and CLI tests run their proxies on."""

from __future__ import annotations

BETA_KEY = "sk-test-secret-key-1234"


def config_text(upstream_url: str, refused_url: str, token: str | None) -> str:
    """Two providers: `alpha` (local, two connections, served by the fake upstream) and `beta` (apikey,
    one connection with a key, at a refused port: no test sends it traffic)."""
    server = f'[server]\nmanagement_token = "{token}"\n' if token else ""
    return f"""{server}
[providers.alpha]
class = "local"
base_url = "{upstream_url}"

[[providers.alpha.connections]]
id = "alpha-1"
priority = 1

[[providers.alpha.connections]]
id = "alpha-2"
priority = 2

[providers.beta]
class = "apikey"
base_url = "{refused_url}"

[[providers.beta.connections]]
id = "beta-1"
name = "Beta main"
api_key = "{BETA_KEY}"
max_concurrent = 2
"""
