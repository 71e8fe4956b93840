-- The meter's ledger. Append-only tables reject UPDATE, DELETE and TRUNCATE
-- through triggers, which bind every role, the owner and superusers included.
-- Time: bigint microseconds since the epoch. GPUs: integer counts.
-- Money: numeric with fixed scales (prices 9 places, row costs 15: exact).

CREATE FUNCTION kestrel_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'table % is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TABLE tenants (
  tenant      text PRIMARY KEY CHECK (tenant ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
  created_us  bigint NOT NULL
);

CREATE TABLE prices (
  price_id         bigserial PRIMARY KEY,
  flavor           text NOT NULL,
  price_per_gpu_s  numeric(20, 9) NOT NULL CHECK (price_per_gpu_s >= 0),
  effective_us     bigint NOT NULL
);
CREATE INDEX prices_flavor ON prices (flavor, effective_us DESC);

CREATE TABLE credits (
  credit_id    bigserial PRIMARY KEY,
  tenant       text NOT NULL REFERENCES tenants,
  top_up_id    text NOT NULL UNIQUE,
  amount       numeric(30, 9) NOT NULL CHECK (amount > 0),
  note         text NOT NULL DEFAULT '',
  recorded_us  bigint NOT NULL
);
CREATE INDEX credits_tenant ON credits (tenant);

CREATE TABLE workload_events (
  event_id     text PRIMARY KEY,
  tenant       text NOT NULL,
  workload_id  text NOT NULL,
  kind         smallint NOT NULL,
  type         smallint NOT NULL,
  time_us      bigint NOT NULL,
  flavor       text NOT NULL,
  gpus         integer NOT NULL,
  received_us  bigint NOT NULL
);

-- The meter's working state per allocation: a projection of workload_events
-- and ledger (metered_until_us = the last row's end), kept for speed.
CREATE TABLE allocations (
  workload_id       text PRIMARY KEY,
  tenant            text NOT NULL,
  kind              smallint NOT NULL,
  flavor            text NOT NULL,
  gpus              integer NOT NULL,
  price             numeric(20, 9) NOT NULL,
  status            smallint NOT NULL,
  start_us          bigint,
  metered_until_us  bigint,
  end_us            bigint
);
CREATE INDEX allocations_open ON allocations (tenant) WHERE status = 1;

CREATE TABLE ledger (
  row_id       bigserial PRIMARY KEY,
  tenant       text NOT NULL,
  workload_id  text NOT NULL,
  flavor       text NOT NULL,
  gpus         integer NOT NULL CHECK (gpus > 0),
  start_us     bigint NOT NULL,
  end_us       bigint NOT NULL CHECK (end_us > start_us),
  gpu_us       bigint NOT NULL,
  price        numeric(20, 9) NOT NULL,
  cost         numeric(38, 15) NOT NULL,
  cause_id     text NOT NULL UNIQUE,
  kind         text NOT NULL CHECK (kind IN ('usage', 'reversal')),
  recorded_us  bigint NOT NULL,
  CHECK (gpu_us = CASE kind WHEN 'usage' THEN 1 ELSE -1 END * gpus::bigint * (end_us - start_us)),
  CHECK (cost * 1000000 = gpu_us * price),
  UNIQUE (workload_id, kind, start_us)
);
CREATE INDEX ledger_tenant_time ON ledger (tenant, start_us);
CREATE INDEX ledger_workload ON ledger (workload_id);

-- Budget holds (reservations) are admission's: its migration 0004 creates them. (This
-- file created them until then; a database made so keeps them, and 0004 adopts them.)

DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['prices', 'credits', 'workload_events', 'ledger'] LOOP
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I
                    FOR EACH ROW EXECUTE FUNCTION kestrel_reject_change()',
                   t || '_append_only', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I
                    FOR EACH STATEMENT EXECUTE FUNCTION kestrel_reject_change()',
                   t || '_no_truncate', t);
  END LOOP;
END $$;

-- Operators read the ledger through this role; it can never write.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kestrel_reader') THEN
    CREATE ROLE kestrel_reader NOLOGIN;
  END IF;
END $$;
GRANT SELECT ON tenants, prices, credits, workload_events, allocations, ledger
  TO kestrel_reader;
REVOKE UPDATE, DELETE, TRUNCATE ON prices, credits, workload_events, ledger FROM PUBLIC;
