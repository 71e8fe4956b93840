// Every figure links to the ledger rows that sum to it: rows of the tenant up to the
// ledger sequence the figure was computed at (Runway.ledger_seq), optionally one flavor.
export function rowsHref(tenant: string, seq: bigint, opts: { figure?: string; value?: string; flavor?: string; workload?: string } = {}): string {
  const q = new URLSearchParams({ seq: seq.toString() });
  if (opts.figure) q.set("figure", opts.figure);
  if (opts.value) q.set("value", opts.value);
  if (opts.flavor) q.set("flavor", opts.flavor);
  if (opts.workload) q.set("workload", opts.workload);
  return `/ledger/${encodeURIComponent(tenant)}?${q}`;
}
