"""OpenAI-compatible HTTP front (`hyserve serve --http-port N`): the same engine and task path as
the gRPC service, spoken as /v1/chat/completions, /v1/completions, /v1/models and /health."""
