import Link from "next/link";
import Failure from "@/components/Failure";
import { describeError, summary, usageRows } from "@/lib/kestrel";
import { gpuSeconds, sameDec, sumDec } from "@/lib/decimal";
import { instant } from "@/lib/format";
import { rowsHref } from "@/lib/links";

export const dynamic = "force-dynamic";

const SHOWN = 2000;

type Search = { seq?: string; flavor?: string; workload?: string; figure?: string; value?: string };

export default async function LedgerPage({ params, searchParams }: {
  params: Promise<{ tenant: string }>; searchParams: Promise<Search>;
}) {
  const tenant = decodeURIComponent((await params).tenant);
  const q = await searchParams;
  let data;
  try {
    const seq = q.seq && /^\d+$/.test(q.seq) ? BigInt(q.seq) : (await summary(tenant)).runway!.ledgerSeq;
    const { rows, truncated } = await usageRows(tenant, { uptoSeq: seq, flavor: q.flavor, workload: q.workload });
    data = { seq, rows, truncated };
  } catch (e) {
    return <><h1>Ledger of {tenant}</h1><Failure what={`Reading ledger rows of ${tenant}`} message={describeError(e)} /></>;
  }
  const { seq, rows, truncated } = data;
  const cost = sumDec(rows.map((r) => r.cost));
  const gpuUs = rows.reduce((a, r) => a + r.gpuUs, 0n);
  const gpuS = gpuSeconds(gpuUs);
  const figureSum = q.figure === "gpu-seconds" ? gpuS : cost;
  const matches = q.value !== undefined && q.figure ? sameDec(q.value, figureSum) : undefined;
  return (
    <>
      <h1>Ledger rows of <Link href={`/tenants/${encodeURIComponent(tenant)}`}>{tenant}</Link></h1>
      <p className="muted">
        Rows with row id ≤ {seq.toString()} (the ledger sequence the figure was computed at)
        {q.flavor && <>, flavor {q.flavor}</>}{q.workload && <>, workload <code>{q.workload}</code></>}, oldest first.
        {" "}<Link href={`/ledger/${encodeURIComponent(tenant)}`}>latest rows</Link>
      </p>
      <div className="cards">
        <div className="card"><div className="muted">rows</div><div className="big" data-testid="rows-count">{rows.length}</div></div>
        <div className="card"><div className="muted">Σ cost (credits)</div><div className="big" data-testid="rows-sum-cost">{cost}</div></div>
        <div className="card"><div className="muted">Σ GPU-seconds</div><div className="big" data-testid="rows-sum-gpu-s">{gpuS}</div></div>
        {q.figure && q.value !== undefined && (
          <div className="card" data-testid="figure-check">
            <div className="muted">{q.figure} shown</div>
            <div className="big">{q.value}</div>
            <div className={matches ? "ok" : "bad"} data-testid="figure-match">{matches ? "= Σ of these rows" : `≠ Σ of these rows (${figureSum})`}</div>
          </div>
        )}
      </div>
      {truncated && <p className="error">More than 50 000 rows: the sums above cover the first 50 000 only.</p>}
      <table data-testid="ledger-rows">
        <thead><tr><th>row</th><th>workload</th><th>flavor</th><th>GPUs</th><th>start</th><th>end</th><th>GPU-seconds</th><th>price /GPU-s</th><th>cost</th><th>cause</th></tr></thead>
        <tbody>
          {rows.slice(0, SHOWN).map((r) => (
            <tr key={r.rowId.toString()} data-testid="ledger-row">
              <td className="num">{r.rowId.toString()}</td>
              <td><Link href={rowsHref(tenant, seq, { workload: r.workloadId })}><code>{r.workloadId}</code></Link></td>
              <td>{r.flavor}</td>
              <td className="num">{r.gpus}</td>
              <td>{instant(r.startUs)}</td>
              <td>{instant(r.endUs)}</td>
              <td className="num" data-testid="row-gpu-s">{gpuSeconds(r.gpuUs)}</td>
              <td className="num">{r.pricePerGpuS}</td>
              <td className="num" data-testid="row-cost">{r.cost}</td>
              <td><code>{r.causeId}</code></td>
            </tr>
          ))}
        </tbody>
      </table>
      {rows.length > SHOWN && <p className="muted">Showing the first {SHOWN} of {rows.length} rows; the sums cover all of them.</p>}
    </>
  );
}
