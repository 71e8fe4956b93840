import Link from "next/link";
import Gauge from "@/components/Gauge";
import BurnDown from "@/components/BurnDown";
import Live from "@/components/Live";
import Failure from "@/components/Failure";
import HeldTable from "@/components/HeldTable";
import { describeError, getTenant, heldJobs, summary, usageRows } from "@/lib/kestrel";
import { gpuSeconds } from "@/lib/decimal";
import { duration, instant, runwayText } from "@/lib/format";
import { rowsHref } from "@/lib/links";

export const dynamic = "force-dynamic";

export default async function TenantPage({ params }: { params: Promise<{ tenant: string }> }) {
  const tenant = decodeURIComponent((await params).tenant);
  let data;
  try {
    const [t, s, held] = await Promise.all([getTenant(tenant), summary(tenant), heldJobs(tenant)]);
    const rows = await usageRows(tenant, { uptoSeq: s.runway!.ledgerSeq, limit: 20_000 });
    data = { t, s, held, rows };
  } catch (e) {
    return <><h1>Tenant {tenant}</h1><Failure what={`Reading tenant ${tenant}`} message={describeError(e)} /></>;
  }
  const { t, s, held, rows } = data;
  const r = s.runway!;
  const gpuUs = s.flavors.reduce((a, f) => a + f.gpuUs, 0n);
  return (
    <>
      <Live at={instant(r.asOfUs)} />
      <h1>Tenant {tenant}{t?.suspended && " (suspended)"}</h1>
      <div className="cards">
        <div className="card"><Gauge bp={r.remainingBp} label="remaining of credits" size={160} /></div>
        <div className="card">
          <div className="muted">runway (remaining / burn)</div>
          <div className="big" data-testid="runway">{runwayText(r)}</div>
          <div className="muted">runway_s <span data-testid="runway-s">{r.unlimited ? "unlimited" : String(r.runwayS)}</span></div>
          <div className="muted">money lasts {r.unlimited ? "∞" : duration(r.moneyRunwayS)} (credits − charged at this burn)</div>
        </div>
        <div className="card">
          <div>credits <b data-testid="credits">{r.credits}</b></div>
          <div>charged <Link data-testid="charged" href={rowsHref(tenant, r.ledgerSeq, { figure: "charged", value: r.charged })}>{r.charged}</Link></div>
          <div>reserved <Link data-testid="reserved" href={`/jobs?tenant=${encodeURIComponent(tenant)}#reserved`}>{r.reserved}</Link></div>
          <div>remaining <b data-testid="remaining">{r.remaining}</b> (free to reserve {r.freeToReserve})</div>
        </div>
        <div className="card">
          <div>burn <b data-testid="burn">{r.burnPerS}</b> credits/s</div>
          <div>running GPUs <b>{r.runningGpus}</b>, open allocations {s.openAllocations}</div>
          <div>GPU-seconds <Link data-testid="gpu-seconds" href={rowsHref(tenant, r.ledgerSeq, { figure: "gpu-seconds", value: gpuSeconds(gpuUs) })}>{gpuSeconds(gpuUs)}</Link></div>
          <div className="muted">ledger rows {s.rows.toString()} (≤ seq <span data-testid="ledger-seq">{r.ledgerSeq.toString()}</span>), top-ups {s.topUps.toString()}</div>
        </div>
      </div>

      <h2>Burn-down</h2>
      <BurnDown credits={r.credits} asOfUs={Number(r.asOfUs)} burnPerS={Number(r.burnPerS)}
        moneyRunwayS={r.moneyRunwayS} unlimited={r.unlimited}
        points={rows.rows.map((x) => ({ tUs: Number(x.endUs), cost: x.cost }))} />

      <h2>Per flavor</h2>
      <table data-testid="flavors">
        <thead><tr><th>flavor</th><th>GPU-seconds</th><th>cost</th><th>rows</th><th>quota (GPUs)</th></tr></thead>
        <tbody>
          {s.flavors.map((f) => (
            <tr key={f.flavor}>
              <td>{f.flavor}</td>
              <td className="num"><Link href={rowsHref(tenant, r.ledgerSeq, { figure: "gpu-seconds", value: gpuSeconds(f.gpuUs), flavor: f.flavor })}>{gpuSeconds(f.gpuUs)}</Link></td>
              <td className="num"><Link href={rowsHref(tenant, r.ledgerSeq, { figure: "charged", value: f.cost, flavor: f.flavor })}>{f.cost}</Link></td>
              <td className="num">{f.rows.toString()}</td>
              <td className="num">{t?.gpuQuota[f.flavor] ?? 0}</td>
            </tr>
          ))}
          {s.flavors.length === 0 && <tr><td colSpan={5} className="muted">nothing metered yet</td></tr>}
        </tbody>
      </table>

      <h2>Held jobs</h2>
      <HeldTable jobs={held} />
      <p><Link href={`/jobs?tenant=${encodeURIComponent(tenant)}`}>All of {tenant}&apos;s jobs the console can see</Link></p>
    </>
  );
}

