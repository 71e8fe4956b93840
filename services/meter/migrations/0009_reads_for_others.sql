-- What the other services read of the meter's tables, as the meter defines it. Before
-- this, admission, the gateway and the placer selected from the ledger, credits,
-- allocations and prices themselves, each query written against the meter's table
-- layout. Now admission's budget snapshot is a function and the current prices a view,
-- both owned here (running with the owner's rights), and those roles lose their grants
-- on the tables. The reader role keeps its grants: operators query the ledger directly.

-- The price of each flavor now: its latest row.
CREATE VIEW current_prices AS
  SELECT DISTINCT ON (flavor) flavor, price_per_gpu_s
  FROM prices ORDER BY flavor, effective_us DESC, price_id DESC;

-- One tenant's figures for one admission decision, in one snapshot: its credits, the
-- cost of its ledger rows after `after_seq` and the highest row id among them, and for
-- each of `started` (job ids) whether its allocation is closed (status 2, CLOSED) and,
-- with `costs`, its ledger cost so far (one row per meter tick: the dear part).
CREATE FUNCTION meter_budget(p_tenant text, p_after_seq bigint, p_started text[],
                             p_costs boolean)
RETURNS TABLE (credits numeric, charged numeric, seq bigint, allocs json)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
  SELECT (SELECT coalesce(sum(c.amount), 0) FROM credits c WHERE c.tenant = p_tenant),
         l.s, l.m,
         (SELECT coalesce(json_agg(json_build_array(
                   a.workload_id, a.status = 2,
                   CASE WHEN p_costs THEN (SELECT coalesce(sum(x.cost), 0)::text FROM ledger x
                                           WHERE x.workload_id = a.workload_id) END)), '[]')
          FROM allocations a WHERE a.workload_id = ANY(p_started))
  FROM (SELECT coalesce(sum(g.cost), 0) AS s, coalesce(max(g.row_id), p_after_seq) AS m
        FROM ledger g WHERE g.tenant = p_tenant AND g.row_id > p_after_seq) l
$$;

REVOKE ALL ON FUNCTION meter_budget(text, bigint, text[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION meter_budget(text, bigint, text[], boolean) TO kestrel_admission;
REVOKE ALL ON current_prices FROM PUBLIC;
GRANT SELECT ON current_prices
  TO kestrel_meter, kestrel_admission, kestrel_gateway, kestrel_placer, kestrel_reader;

REVOKE SELECT ON tenants, prices, credits, workload_events, allocations, ledger
  FROM kestrel_admission, kestrel_gateway, kestrel_placer;
