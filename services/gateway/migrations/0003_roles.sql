-- Who may do what (see services/meter/migrations/0005_roles.sql): the gateway's role
-- writes tenant profiles and API keys; every service and the reader may read the
-- profiles; the reader sees API keys without their secret hashes.
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
GRANT SELECT ON tenant_profiles
  TO kestrel_meter, kestrel_admission, kestrel_gateway, kestrel_placer, kestrel_reader;
GRANT INSERT, UPDATE ON tenant_profiles TO kestrel_gateway;
GRANT SELECT, INSERT, UPDATE ON api_keys TO kestrel_gateway;
GRANT SELECT (key_id, tenant, name, created_us, revoked_us) ON api_keys TO kestrel_reader;
