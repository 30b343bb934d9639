"""Real-HTTP fakes for integration tests: a uvicorn LiveServer and a scriptable OpenAI-compatible upstream."""

from tests.fakes.server import LiveServer, serve
from tests.fakes.upstream import FakeUpstream, RecordedRequest, Reply, ReplyKind

__all__ = ["FakeUpstream", "LiveServer", "RecordedRequest", "Reply", "ReplyKind", "serve"]
