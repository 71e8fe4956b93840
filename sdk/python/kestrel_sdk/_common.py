"""What the sync and asyncio clients share: settings from arguments or environment,
and the per-call metadata (bearer credential and a fresh x-request-id)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from kestrel_sdk._errors import InvalidArgument, MissingCredential

DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_ADDRESS = "KESTREL_GATEWAY_ADDR"
ENV_API_KEY = "KESTREL_API_KEY"
ENV_OPERATOR_TOKEN = "KESTREL_OPERATOR_TOKEN"
DEFAULT_PAGE_SIZE = 100

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Settings:
    address: str
    api_key: str | None
    operator_token: str | None
    timeout_s: float

    @classmethod
    def resolve(cls, address: str | None, api_key: str | None, operator_token: str | None,
                timeout_s: float) -> Settings:
        """Arguments win; otherwise the KESTREL_* environment; empty strings count as unset."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be greater than zero")
        return cls(address=address or os.environ.get(ENV_ADDRESS) or DEFAULT_ADDRESS,
                   api_key=api_key or os.environ.get(ENV_API_KEY) or None,
                   operator_token=operator_token or os.environ.get(ENV_OPERATOR_TOKEN) or None,
                   timeout_s=timeout_s)

    def metadata(self, *, operator: bool) -> tuple[Metadata, str]:
        """Call metadata and its request id; raises MissingCredential before any I/O."""
        if operator:
            secret = self.operator_token
            if not secret:
                raise MissingCredential("operator token", "operator_token",
                                        ENV_OPERATOR_TOKEN)
        else:
            secret = self.api_key
            if not secret:
                raise MissingCredential("API key", "api_key", ENV_API_KEY)
        request_id = new_request_id()
        return (("authorization", f"Bearer {secret}"), ("x-request-id", request_id)), request_id


def new_request_id() -> str:
    return uuid.uuid4().hex


def check_page_size(page_size: int) -> int:
    if not 1 <= page_size <= 1000:
        raise InvalidArgument(None, "page_size must be between 1 and 1000",
                              [("page_size", "must be between 1 and 1000")])
    return page_size
