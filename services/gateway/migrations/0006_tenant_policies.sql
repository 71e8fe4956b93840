-- What the other services read of a tenant's profile, as the gateway defines it: the
-- GPU quota, what it may borrow beyond it, and whether it is suspended (admission
-- decides with them, the placer writes them into the tenant's ClusterQueue). Before
-- this they selected from tenant_profiles itself; now they read this view (running with
-- its owner's rights) and lose their grant on the table. The reader keeps its grant.
CREATE VIEW tenant_policies AS
  SELECT tenant, gpu_quota, gpu_borrow, suspended FROM tenant_profiles;

REVOKE ALL ON tenant_policies FROM PUBLIC;
GRANT SELECT ON tenant_policies
  TO kestrel_admission, kestrel_placer, kestrel_gateway, kestrel_reader;
REVOKE SELECT ON tenant_profiles FROM kestrel_meter, kestrel_admission, kestrel_placer;
