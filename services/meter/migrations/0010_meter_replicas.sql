-- Several meter replicas at once. Every write of a meter (a batch of events, a tick, a
-- top-up or adjustment, a price) first locks the one row of meter_head, FOR UPDATE,
-- and commits it with version + 1: writers take turns, so a replica decides from
-- the allocations and credits every other one has committed, and the ledger's row
-- ids (and chain_seq) rise in commit order with no gap a reader could see filled in
-- later. A replica that finds the version moved by someone else reads what changed
-- after its own mark (ledger rows by row_id, credits by credit_id, prices by
-- price_id, allocations by the version that last wrote them) before it decides.
-- last_tick_us: when a tick last cut open allocations, so that two replicas ticking
-- each second cut them once a second between them, not twice.
CREATE TABLE meter_head (
  id            smallint PRIMARY KEY CHECK (id = 1),
  version       bigint NOT NULL,
  last_tick_us  bigint NOT NULL
);
INSERT INTO meter_head VALUES (1, 0, 0);

ALTER TABLE allocations ADD COLUMN version bigint NOT NULL DEFAULT 0;
CREATE INDEX allocations_version ON allocations (version);

GRANT SELECT, UPDATE ON meter_head TO kestrel_meter;
GRANT SELECT ON meter_head TO kestrel_reader;
