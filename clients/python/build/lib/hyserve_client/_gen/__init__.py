"""Generated protobuf and gRPC code for the hyserve.v1 API (proto/hyserve/v1/).

Do not edit: regenerate with `python -m hyserve.api.codegen` (and verify with `--check`).
"""
