-- A hash chain over the ledger, so that a rewrite the triggers cannot stop (by a
-- superuser in replica mode, or by the owner with its triggers disabled) is seen by
-- an audit (python -m services.meter.audit). Each row carries its place in the chain
-- (chain_seq: 1, 2, 3, ... in insertion order, no gaps), the previous row's hash and
-- its own: row_hash = sha256(prev_hash || its columns, each as text, length-prefixed).
-- Filled by a BEFORE INSERT trigger under a transaction-scoped advisory lock, so
-- concurrent writers append one after the other; whatever a writer puts in these
-- columns is overwritten. The first row's prev_hash is 32 zero bytes.
ALTER TABLE ledger ADD COLUMN chain_seq bigint, ADD COLUMN prev_hash bytea,
  ADD COLUMN row_hash bytea;
CREATE UNIQUE INDEX ledger_chain_seq ON ledger (chain_seq);

-- The hashed text: for each value, its length in characters, ':' and the value, in
-- this order. Spelled out twice, here and in the trigger (there inline: a function
-- call per row doubled the trigger's cost); the tests hold the two, and the audit's
-- Python, to the same bytes.
CREATE FUNCTION kestrel_ledger_digest(prev bytea, r ledger) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
  SELECT sha256(prev || convert_to(
    length(r.chain_seq::text) || ':' || r.chain_seq::text
    || length(r.row_id::text) || ':' || r.row_id::text
    || length(r.tenant) || ':' || r.tenant
    || length(r.workload_id) || ':' || r.workload_id
    || length(r.flavor) || ':' || r.flavor
    || length(r.gpus::text) || ':' || r.gpus::text
    || length(r.start_us::text) || ':' || r.start_us::text
    || length(r.end_us::text) || ':' || r.end_us::text
    || length(r.gpu_us::text) || ':' || r.gpu_us::text
    || length(r.price::text) || ':' || r.price::text
    || length(r.cost::text) || ':' || r.cost::text
    || length(r.cause_id) || ':' || r.cause_id
    || length(r.kind) || ':' || r.kind
    || length(r.recorded_us::text) || ':' || r.recorded_us::text, 'UTF8'))
$$;

CREATE FUNCTION kestrel_ledger_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  head record;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('kestrel-ledger-chain'));
  SELECT chain_seq, row_hash INTO head FROM ledger
    WHERE chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1;
  NEW.chain_seq := coalesce(head.chain_seq, 0) + 1;
  NEW.prev_hash := coalesce(head.row_hash, decode(repeat('00', 32), 'hex'));
  NEW.row_hash := sha256(NEW.prev_hash || convert_to(
    length(NEW.chain_seq::text) || ':' || NEW.chain_seq::text
    || length(NEW.row_id::text) || ':' || NEW.row_id::text
    || length(NEW.tenant) || ':' || NEW.tenant
    || length(NEW.workload_id) || ':' || NEW.workload_id
    || length(NEW.flavor) || ':' || NEW.flavor
    || length(NEW.gpus::text) || ':' || NEW.gpus::text
    || length(NEW.start_us::text) || ':' || NEW.start_us::text
    || length(NEW.end_us::text) || ':' || NEW.end_us::text
    || length(NEW.gpu_us::text) || ':' || NEW.gpu_us::text
    || length(NEW.price::text) || ':' || NEW.price::text
    || length(NEW.cost::text) || ':' || NEW.cost::text
    || length(NEW.cause_id) || ':' || NEW.cause_id
    || length(NEW.kind) || ':' || NEW.kind
    || length(NEW.recorded_us::text) || ':' || NEW.recorded_us::text, 'UTF8'));
  RETURN NEW;
END $$;

-- Rows written before this migration join the chain in row_id order: the one
-- sanctioned rewrite of the ledger, by its owner, recorded in schema_migrations.
ALTER TABLE ledger DISABLE TRIGGER ledger_append_only;
DO $$
DECLARE
  r ledger;
  prev bytea := decode(repeat('00', 32), 'hex');
  n bigint := 0;
BEGIN
  FOR r IN SELECT * FROM ledger ORDER BY row_id LOOP
    n := n + 1;
    r.chain_seq := n;
    UPDATE ledger SET chain_seq = n, prev_hash = prev,
                      row_hash = kestrel_ledger_digest(prev, r)
      WHERE row_id = r.row_id RETURNING row_hash INTO prev;
  END LOOP;
END $$;
ALTER TABLE ledger ENABLE TRIGGER ledger_append_only;

CREATE TRIGGER ledger_chain BEFORE INSERT ON ledger
  FOR EACH ROW EXECUTE FUNCTION kestrel_ledger_chain();
