"""Python SDK of Kestrel's public gRPC API (kestrel.v1.Gateway).

    import kestrel
    with kestrel_sdk.Client(api_key="ks_...") as c:
        job = c.submit_job(name="train", gpus=2, max_duration_s=600)
        for snapshot in c.watch_job(job.job_id):
            print(snapshot.state, snapshot.reason)

`kestrel_sdk.AsyncClient` offers the same methods for asyncio. Results are frozen
dataclasses of this package (never protobuf messages); money is `Decimal`;
failures raise `KestrelError` subclasses carrying the gRPC code.
"""

from kestrel_sdk._async import AsyncClient
from kestrel_sdk._common import (
    DEFAULT_ADDRESS,
    ENV_ADDRESS,
    ENV_API_KEY,
    ENV_OPERATOR_TOKEN,
)
from kestrel_sdk._convert import (
    ApiKey,
    ApiKeyCreated,
    Job,
    JobSpec,
    JobState,
    Runway,
    Tenant,
    TopUpResult,
    UsageRow,
    to_jsonable,
)
from kestrel_sdk._endpoints import Endpoint, InferResult, Priority
from kestrel_sdk._errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    KestrelError,
    MissingCredential,
    NotFound,
    PermissionDenied,
    RateLimited,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    from_rpc_error,
    from_status,
)
from kestrel_sdk._sync import Client

__all__ = [
    "DEFAULT_ADDRESS",
    "ENV_ADDRESS",
    "ENV_API_KEY",
    "ENV_OPERATOR_TOKEN",
    "Aborted",
    "AlreadyExists",
    "ApiKey",
    "ApiKeyCreated",
    "AsyncClient",
    "Cancelled",
    "Client",
    "DeadlineExceeded",
    "Endpoint",
    "FailedPrecondition",
    "InferResult",
    "Internal",
    "InvalidArgument",
    "Job",
    "JobSpec",
    "JobState",
    "KestrelError",
    "MissingCredential",
    "NotFound",
    "PermissionDenied",
    "Priority",
    "RateLimited",
    "Runway",
    "Tenant",
    "TopUpResult",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "UsageRow",
    "from_rpc_error",
    "from_status",
    "to_jsonable",
]
