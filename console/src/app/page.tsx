import Link from "next/link";
import Gauge from "@/components/Gauge";
import Live from "@/components/Live";
import Failure from "@/components/Failure";
import { describeError, listTenants, summary } from "@/lib/kestrel";
import { gpuSeconds } from "@/lib/decimal";
import { runwayText } from "@/lib/format";
import { rowsHref } from "@/lib/links";

export const dynamic = "force-dynamic";

export default async function TenantsPage() {
  let data;
  try {
    const tenants = await listTenants();
    data = await Promise.all(tenants.map(async (t) => ({ t, s: await summary(t.tenant) })));
  } catch (e) {
    return <><h1>Tenants</h1><Failure what="Reading tenants" message={describeError(e)} /></>;
  }
  return (
    <>
      <Live at={new Date().toISOString()} />
      <h1>Tenants</h1>
      <p className="muted">Runway and money from the meter (GetTenantSummary); every charged and GPU-seconds figure links to the ledger rows that sum to it.</p>
      <table data-testid="tenants">
        <thead>
          <tr><th>tenant</th><th>remaining</th><th>runway</th><th>credits</th><th>charged</th><th>reserved</th>
            <th>remaining credits</th><th>burn /s</th><th>running GPUs</th><th>GPU-seconds</th><th>ledger seq</th></tr>
        </thead>
        <tbody>
          {data.map(({ t, s }) => {
            const r = s.runway!;
            const gpuUs = s.flavors.reduce((a, f) => a + f.gpuUs, 0n);
            return (
              <tr key={t.tenant} data-testid={`tenant-${t.tenant}`}>
                <td><Link href={`/tenants/${encodeURIComponent(t.tenant)}`}>{t.tenant}</Link>{t.suspended && " (suspended)"}</td>
                <td><Gauge bp={r.remainingBp} label="of credits" size={90} /></td>
                <td data-testid="runway">{runwayText(r)}</td>
                <td className="num">{r.credits}</td>
                <td className="num"><Link data-testid="charged" href={rowsHref(t.tenant, r.ledgerSeq, { figure: "charged", value: r.charged })}>{r.charged}</Link></td>
                <td className="num"><Link href={`/jobs?tenant=${encodeURIComponent(t.tenant)}#reserved`}>{r.reserved}</Link></td>
                <td className="num">{r.remaining}</td>
                <td className="num">{r.burnPerS}</td>
                <td className="num">{r.runningGpus}</td>
                <td className="num"><Link data-testid="gpu-seconds" href={rowsHref(t.tenant, r.ledgerSeq, { figure: "gpu-seconds", value: gpuSeconds(gpuUs) })}>{gpuSeconds(gpuUs)}</Link></td>
                <td className="num">{r.ledgerSeq.toString()}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {data.length === 0 && <p>No tenants yet (kestrel tenant create …).</p>}
    </>
  );
}
