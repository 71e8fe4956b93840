"""The gateway: Kestrel's public gRPC API."""
