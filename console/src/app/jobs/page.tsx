import Link from "next/link";
import Live from "@/components/Live";
import Failure from "@/components/Failure";
import HeldTable from "@/components/HeldTable";
import { describeError, heldJobs, listAllJobs, listTenants, summary, usageRows } from "@/lib/kestrel";
import { gpuSeconds, sumDec } from "@/lib/decimal";
import { instant } from "@/lib/format";
import { rowsHref } from "@/lib/links";

export const dynamic = "force-dynamic";
const ALL_JOBS_SHOWN = 500;

type Workload = { tenant: string; id: string; flavor: string; gpus: number; gpuUs: bigint; costs: string[]; start: bigint; end: bigint; rows: number; seq: bigint };

export default async function JobsPage({ searchParams }: { searchParams: Promise<{ tenant?: string }> }) {
  const only = (await searchParams).tenant;
  let data, all;
  try {
    all = await listAllJobs(only ?? "", ALL_JOBS_SHOWN);
    const names = only ? [only] : (await listTenants()).map((t) => t.tenant);
    data = await Promise.all(names.map(async (tenant) => {
      const [held, s] = await Promise.all([heldJobs(tenant), summary(tenant)]);
      const seq = s.runway!.ledgerSeq;
      const { rows } = await usageRows(tenant, { uptoSeq: seq, limit: 20_000 });
      return { tenant, held, runway: s.runway!, seq, rows };
    }));
  } catch (e) {
    return <><h1>Jobs</h1><Failure what="Reading jobs" message={describeError(e)} /></>;
  }
  const held = data.flatMap((d) => d.held);
  const workloads = new Map<string, Workload>();
  for (const d of data) {
    for (const r of d.rows) {
      const key = `${d.tenant}/${r.workloadId}`;
      const w = workloads.get(key) ?? { tenant: d.tenant, id: r.workloadId, flavor: r.flavor, gpus: r.gpus, gpuUs: 0n, costs: [], start: r.startUs, end: r.endUs, rows: 0, seq: d.seq };
      w.gpuUs += r.gpuUs; w.costs.push(r.cost); w.rows += 1;
      if (r.startUs < w.start) w.start = r.startUs;
      if (r.endUs > w.end) w.end = r.endUs;
      workloads.set(key, w);
    }
  }
  return (
    <>
      <Live at={new Date().toISOString()} />
      <h1>Jobs{only && <> of <Link href={`/tenants/${encodeURIComponent(only)}`}>{only}</Link></>}</h1>
      <h2>Held for budget</h2>
      <p className="muted">From admission (ListHeld), in the order they would be released; the reason is the runway check&apos;s.</p>
      <HeldTable jobs={held} withTenant />

      <h2>All jobs</h2>
      <p className="muted">From the gateway (the operator&apos;s ListAllJobs), newest first{all.truncated ? `: the latest ${ALL_JOBS_SHOWN}` : ""}: every state, the flavor the placer chose and why, the credits reserved at admission.</p>
      <HeldTable jobs={all.jobs} withTenant withReserved testId="all-jobs" empty="No job submitted yet." />

      <h2>Metered work</h2>
      <p className="muted">Workloads the ledger has rows for (from the meter&apos;s ListUsage): what has run or runs now, with its GPU-seconds and cost.</p>
      <table data-testid="metered">
        <thead><tr><th>workload</th><th>tenant</th><th>flavor</th><th>GPUs</th><th>first metered</th><th>last metered</th><th>GPU-seconds</th><th>cost</th><th>rows</th></tr></thead>
        <tbody>
          {[...workloads.values()].map((w) => (
            <tr key={`${w.tenant}/${w.id}`}>
              <td><code>{w.id}</code></td>
              <td><Link href={`/tenants/${encodeURIComponent(w.tenant)}`}>{w.tenant}</Link></td>
              <td>{w.flavor}</td>
              <td className="num">{w.gpus}</td>
              <td>{instant(w.start)}</td>
              <td>{instant(w.end)}</td>
              <td className="num">{gpuSeconds(w.gpuUs)}</td>
              <td className="num"><Link href={rowsHref(w.tenant, w.seq, { workload: w.id, figure: "charged", value: sumDec(w.costs) })}>{sumDec(w.costs)}</Link></td>
              <td className="num">{w.rows}</td>
            </tr>
          ))}
          {workloads.size === 0 && <tr><td colSpan={9} className="muted">nothing metered yet</td></tr>}
        </tbody>
      </table>

      <h2 id="reserved">Reservations</h2>
      <table>
        <thead><tr><th>tenant</th><th>reserved (admission&apos;s holds, unconsumed)</th><th>credits</th><th>charged</th><th>remaining</th></tr></thead>
        <tbody>
          {data.map((d) => (
            <tr key={d.tenant}><td>{d.tenant}</td><td className="num" data-testid={`reserved-${d.tenant}`}>{d.runway.reserved}</td><td className="num">{d.runway.credits}</td><td className="num">{d.runway.charged}</td><td className="num">{d.runway.remaining}</td></tr>
          ))}
        </tbody>
      </table>
      <p className="muted">Reservations are admission&apos;s holds, not ledger rows: they have no rows to link to; each held or admitted job&apos;s own reservation is in the table above.</p>
    </>
  );
}
