-- The meter keeps every open hold in memory and, when admission announces that a job
-- moved, reads that job's holds again by workload id (meter HoldBook): one index probe
-- each, where it re-read and summed all of the tenant's open holds (0.7 ms of Postgres a
-- job in bench-jobs, more as the queue grew).
CREATE INDEX IF NOT EXISTS open_reservations_workload ON open_reservations (workload_id);
