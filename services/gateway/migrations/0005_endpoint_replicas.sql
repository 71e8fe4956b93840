-- Endpoint replicas (issue 13): each replica is a Kestrel job (JobSpec.endpoint_id set)
-- that admission reserved a rolling horizon for and the placer runs as a Kueue Workload.
-- The endpoint row lists the job ids of its replicas, newest last; a deleted endpoint
-- keeps them so its ledger rows stay traceable to it.
ALTER TABLE endpoints ADD COLUMN replicas text[] NOT NULL DEFAULT '{}';
