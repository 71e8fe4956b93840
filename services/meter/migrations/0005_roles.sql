-- Who may do what. The tables belong to kestrel_owner, a role that is not a superuser
-- and only runs migrations; each service connects as its own role, which is neither a
-- superuser nor a member of the owner, and gets exactly these grants. Such a role
-- cannot UPDATE, DELETE or TRUNCATE an append-only table (no privilege, and the
-- triggers of 0001 besides), cannot ALTER TABLE ... DISABLE TRIGGER or DROP TRIGGER
-- (owner only) and cannot SET session_replication_role = replica (superuser only).
-- The owner and superusers still can: see README, "The ledger and the runway".
-- A role missing here is created without LOGIN (the devstack creates them with LOGIN
-- and passwords beforehand; a migrator that may not create roles fails here).
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

-- Any service may check that the schema is current (kestrel.db.migrate).
GRANT SELECT ON schema_migrations TO kestrel_meter, kestrel_admission, kestrel_gateway,
  kestrel_placer, kestrel_reader;

-- Reads: services still read each other's tables (a later change removes that).
GRANT SELECT ON tenants, prices, credits, workload_events, allocations, ledger
  TO kestrel_meter, kestrel_admission, kestrel_gateway, kestrel_placer, kestrel_reader;

-- The meter writes the ledger and its inputs: INSERT only, UPDATE only on its
-- projection `allocations`.
GRANT INSERT ON tenants, prices, credits, workload_events, ledger TO kestrel_meter;
GRANT INSERT, UPDATE ON allocations TO kestrel_meter;
GRANT USAGE ON SEQUENCE prices_price_id_seq, credits_credit_id_seq, ledger_row_id_seq
  TO kestrel_meter;

-- Admission is the one writer of budget holds: its migration 0004 grants them.
