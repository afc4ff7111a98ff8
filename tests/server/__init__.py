"""Integration: the real server process (`python -m hyserve serve`) on 127.0.0.1 and real gRPC clients.

One server per module (--parallel 1, a small context and queue so that limits are cheap to hit).
Reference completions come from the in-process generator, computed before the server starts so
that only one process evaluates the model at a time. Completions are short (the default model
decodes some 20-50 tokens/s on a small CPU).
"""

import pytest

# the shared helpers are a plain module: their asserts explain a failure only when pytest rewrites them
pytest.register_assert_rewrite("server.support")
