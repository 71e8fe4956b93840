-- Who may do what (see services/meter/migrations/0005_roles.sql): admission's role
-- writes jobs (a mutable projection) and the append-only job_transitions; every
-- service and the reader may read them.
DO $$
DECLARE r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['kestrel_meter', 'kestrel_admission', 'kestrel_gateway',
                           'kestrel_placer', 'kestrel_reader'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      EXECUTE format('CREATE ROLE %I NOLOGIN', r);
    END IF;
  END LOOP;
END $$;

GRANT SELECT ON schema_migrations TO kestrel_meter, kestrel_admission, kestrel_gateway,
  kestrel_placer, kestrel_reader;
GRANT SELECT ON jobs, job_transitions
  TO kestrel_meter, kestrel_admission, kestrel_gateway, kestrel_placer, kestrel_reader;
GRANT INSERT, UPDATE ON jobs TO kestrel_admission;
GRANT INSERT ON job_transitions TO kestrel_admission;
GRANT USAGE ON SEQUENCE jobs_seq_seq, job_transitions_transition_id_seq TO kestrel_admission;
