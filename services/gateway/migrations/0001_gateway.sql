-- The gateway owns tenant profiles and API keys (their one writer).
CREATE TABLE tenant_profiles (
  tenant        text PRIMARY KEY CHECK (tenant ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
  display_name  text NOT NULL DEFAULT '',
  gpu_quota     jsonb NOT NULL DEFAULT '{}',   -- flavor -> GPUs (ClusterQueue nominal quota)
  rate_per_s    double precision NOT NULL CHECK (rate_per_s > 0),
  burst         integer NOT NULL CHECK (burst > 0),
  suspended     boolean NOT NULL DEFAULT false,
  created_us    bigint NOT NULL
);

-- Only a hash of each secret is stored; the secret is shown once at creation.
CREATE TABLE api_keys (
  key_id       text PRIMARY KEY,
  tenant       text NOT NULL REFERENCES tenant_profiles,
  name         text NOT NULL,
  secret_hash  text NOT NULL,
  created_us   bigint NOT NULL,
  revoked_us   bigint NOT NULL DEFAULT 0
);
CREATE INDEX api_keys_tenant ON api_keys (tenant);
