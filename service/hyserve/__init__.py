"""hyserve: a gRPC inference service for GGUF models, built for hybrid and recurrent models."""

__version__ = "0.1.0"
