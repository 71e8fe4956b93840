-- What the other services read of admission's jobs, as admission defines it. Before
-- this the gateway (GetJob, ListJobs, an endpoint's ended replicas) and the placer
-- (whether a queued placement was cancelled) selected from `jobs` itself, and every
-- service could read the append-only job_transitions. Now they read this view (running
-- with its owner's rights; the planner inlines it, so the (tenant, seq) index still
-- serves a listing) and lose their grants on the tables. The reader keeps its grants:
-- operators query the tables directly.
CREATE VIEW job_status AS
  SELECT job_id, tenant, spec, state, reason, reserved, priced_flavor, flavor,
         flavor_reason, idempotency_key, created_us, admitted_us, started_us, finished_us,
         seq, priority, gpus, max_duration_s
  FROM jobs;

REVOKE ALL ON job_status FROM PUBLIC;
GRANT SELECT ON job_status TO kestrel_gateway, kestrel_placer, kestrel_reader;
REVOKE SELECT ON jobs, job_transitions FROM kestrel_meter, kestrel_gateway, kestrel_placer;
