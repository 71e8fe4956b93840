"""Kestrel's server runtime: the library the services share (bus, db, errors, grpcserver,
runway, workloads, ...). Nothing here imports the local-development and operations
tooling (`kestrel_tools`: the local cluster, devstack, plane, demo, helm and compose
checks) or a service.

The tenant SDK and CLI are their own distribution, `kestrel-sdk` (sdk/python), imported as
`kestrel_sdk`; it also ships the generated stubs (`kestrel_sdk.v1`) and the contract's
arithmetic (`kestrel_sdk.money`, `kestrel_sdk.budget`, `kestrel_sdk.tls`) that this
runtime builds on. The server depends on the SDK, never the other way round.
"""
