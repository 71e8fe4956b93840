-- What a tenant may borrow beyond its quota, per flavor (Kueue borrowingLimit).
-- Absent or 0: the quota is a cap. Borrowing is an explicit operator choice.
ALTER TABLE tenant_profiles ADD COLUMN gpu_borrow jsonb NOT NULL DEFAULT '{}';
