-- Admission reads charges incrementally per tenant (row_id > last seen).
CREATE INDEX ledger_tenant_row ON ledger (tenant, row_id);
