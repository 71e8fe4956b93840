-- Jobs are owned by admission: it is their one writer. The gateway reads them.
-- `jobs` is the current state, a projection of the append-only `job_transitions`.
CREATE TABLE jobs (
  seq              bigserial UNIQUE,
  job_id           text PRIMARY KEY,
  tenant           text NOT NULL,
  name             text NOT NULL,
  spec             bytea NOT NULL,            -- kestrel.v1.JobSpec, as submitted
  gpus             integer NOT NULL CHECK (gpus > 0),
  priority         integer NOT NULL,
  max_duration_s   bigint NOT NULL CHECK (max_duration_s > 0),
  state            smallint NOT NULL,         -- kestrel.v1.JobState
  reason           text NOT NULL DEFAULT '',
  reserved         numeric(30, 9) NOT NULL DEFAULT 0,
  priced_flavor    text NOT NULL DEFAULT '',
  flavor           text NOT NULL DEFAULT '',
  flavor_reason    text NOT NULL DEFAULT '',
  idempotency_key  text NOT NULL DEFAULT '',
  created_us       bigint NOT NULL,
  admitted_us      bigint NOT NULL DEFAULT 0,
  started_us       bigint NOT NULL DEFAULT 0,
  finished_us      bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, idempotency_key)
  WHERE idempotency_key <> '';
CREATE INDEX jobs_tenant_seq ON jobs (tenant, seq);
CREATE INDEX jobs_held ON jobs (tenant, priority DESC, seq) WHERE state = 1;

CREATE TABLE job_transitions (
  transition_id  bigserial PRIMARY KEY,
  job_id         text NOT NULL REFERENCES jobs,
  tenant         text NOT NULL,
  from_state     smallint NOT NULL,
  to_state       smallint NOT NULL,
  reason         text NOT NULL,
  time_us        bigint NOT NULL
);
CREATE INDEX job_transitions_job ON job_transitions (job_id);
CREATE TRIGGER job_transitions_append_only BEFORE UPDATE OR DELETE ON job_transitions
  FOR EACH ROW EXECUTE FUNCTION kestrel_reject_change();
