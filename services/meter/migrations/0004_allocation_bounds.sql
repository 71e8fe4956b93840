-- A workload runs under a bound (its Job's activeDeadlineSeconds = the max_duration_s
-- its reservation was priced for); the meter meters nothing past start + bound.
ALTER TABLE workload_events ADD COLUMN max_duration_s bigint NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN limit_us bigint;
