-- Inference endpoints (issue 13), written by the gateway only. Replicas are host
-- processes for now (KESTREL_WORKER_ENDPOINT=<endpoint_id>); a deleted endpoint keeps
-- its row with deleted_us set, so its id is never reused and calls on it say "deleted".
CREATE TABLE endpoints (
  endpoint_id  text PRIMARY KEY CHECK (endpoint_id ~ '^ep-[0-9a-f]{16}$'),
  tenant       text NOT NULL REFERENCES tenant_profiles,
  name         text NOT NULL,
  spec         bytea NOT NULL,          -- kestrel.v1.EndpointSpec as created
  created_us   bigint NOT NULL,
  deleted_us   bigint NOT NULL DEFAULT 0,
  seq          bigserial UNIQUE
);
-- One live endpoint per name and tenant.
CREATE UNIQUE INDEX endpoints_live_name ON endpoints (tenant, name) WHERE deleted_us = 0;
CREATE INDEX endpoints_tenant_seq ON endpoints (tenant, seq);

GRANT SELECT, INSERT, UPDATE ON endpoints TO kestrel_gateway;
GRANT USAGE ON SEQUENCE endpoints_seq_seq TO kestrel_gateway;
GRANT SELECT ON endpoints TO kestrel_reader;
