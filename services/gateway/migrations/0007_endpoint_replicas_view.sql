-- What the placer reads of the gateway's endpoints, as the gateway defines it: whether
-- an endpoint is live and which job ids it records as its replicas. The placer's
-- periodic reconcile ends any replica Job in Kubernetes whose endpoint is deleted (or
-- unknown) or that its live endpoint does not record (issue 56: a deletion that raced
-- a scaling left a replica running and billing with nothing to stop it).
CREATE VIEW endpoint_replicas AS
  SELECT endpoint_id, tenant, deleted_us, replicas FROM endpoints;

REVOKE ALL ON endpoint_replicas FROM PUBLIC;
GRANT SELECT ON endpoint_replicas TO kestrel_placer, kestrel_reader;
