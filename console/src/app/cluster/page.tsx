import Link from "next/link";
import Live from "@/components/Live";
import Failure from "@/components/Failure";
import { describeError, listTenants, summary } from "@/lib/kestrel";

export const dynamic = "force-dynamic";

export default async function ClusterPage() {
  let data;
  try {
    const tenants = await listTenants();
    data = await Promise.all(tenants.map(async (t) => ({ t, r: (await summary(t.tenant)).runway! })));
  } catch (e) {
    return <><h1>Cluster</h1><Failure what="Reading tenants" message={describeError(e)} /></>;
  }
  const flavors = [...new Set(data.flatMap(({ t }) => [...Object.keys(t.gpuQuota), ...Object.keys(t.gpuBorrow)]))].sort();
  return (
    <>
      <Live at={new Date().toISOString()} />
      <h1>Cluster</h1>
      <h2>ClusterQueue quota per tenant</h2>
      <p className="muted">Nominal GPU quota (and borrowing limit) per flavor, as the gateway holds it and the placer applies it to each tenant&apos;s ClusterQueue; running GPUs from the meter&apos;s runway (all flavors).</p>
      <table data-testid="quotas">
        <thead><tr><th>tenant</th>{flavors.map((f) => <th key={f}>{f} quota (borrow)</th>)}<th>running GPUs</th></tr></thead>
        <tbody>
          {data.map(({ t, r }) => (
            <tr key={t.tenant}>
              <td><Link href={`/tenants/${encodeURIComponent(t.tenant)}`}>{t.tenant}</Link></td>
              {flavors.map((f) => <td key={f} className="num">{t.gpuQuota[f] ?? 0}{t.gpuBorrow[f] ? ` (+${t.gpuBorrow[f]})` : ""}</td>)}
              <td className="num">{r.runningGpus}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <div className="missing" data-testid="missing-cluster">
        <strong>Not available over gRPC:</strong> no Kestrel service exposes the nodes
        (pool, GPUs, the <code>kestrel.dev/simulated</code> label: KWOK or real kubelet) or
        Kueue&apos;s ClusterQueue usage per flavor; the placer&apos;s API only writes
        (EnsureTenant, CancelWorkload, Apply/Scale/DeleteEndpoint). Needed: a read call on the
        placer, e.g. ListNodes and ListClusterQueues (quota, reserved and admitted usage per flavor).
      </div>
    </>
  );
}
