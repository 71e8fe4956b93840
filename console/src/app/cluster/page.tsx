import Link from "next/link";
import Live from "@/components/Live";
import Failure from "@/components/Failure";
import { clusterView, describeError, listTenants, summary } from "@/lib/kestrel";

export const dynamic = "force-dynamic";

export default async function ClusterPage() {
  let data, cluster;
  try {
    cluster = await clusterView();
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
      <h2>Nodes</h2>
      {typeof cluster === "string" ? <p className="muted" data-testid="no-placer">{cluster}</p> : (
        <>
          <p className="muted">From the placer (ListNodes, read from the apiserver). <strong>Simulated</strong> nodes are KWOK fakes: their capacity is advertised and Kueue admits against it, but no container runs; the real kubelet runs the CPU pool&apos;s pods.</p>
          <table data-testid="nodes">
            <thead><tr><th>node</th><th>pool</th><th>flavor</th><th>kind</th><th>ready</th><th>GPUs</th><th>CPU</th><th>memory</th></tr></thead>
            <tbody>
              {cluster.nodes.map((n) => (
                <tr key={n.name} data-testid={`node-${n.name}`}>
                  <td><code>{n.name}</code></td><td>{n.pool}</td><td>{n.flavor}</td>
                  <td data-testid="kind">{n.simulated ? <span className="badge">simulated (KWOK)</span> : "real kubelet"}</td>
                  <td>{n.ready ? "yes" : "no"}</td><td className="num">{n.gpus}</td><td className="num">{n.cpu}</td><td className="num">{n.memory}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <h2>ClusterQueues: quota and Kueue&apos;s usage</h2>
          <p className="muted">From the placer (ListClusterQueues): per flavor, nominal quota (and how much it may borrow), what workloads reserve and what admitted ones use, as Kueue reports it.</p>
          <table data-testid="cluster-queues">
            <thead><tr><th>ClusterQueue</th><th>tenant</th><th>flavor</th><th>resource</th><th>quota (borrow)</th><th>reserved</th><th>admitted</th><th>workloads pending / reserving / admitted</th><th>stop policy</th></tr></thead>
            <tbody>
              {cluster.queues.flatMap((q) => q.resources.filter((r) => r.resource === (r.flavor === "cpu" ? "cpu" : "nvidia.com/gpu")).map((r, i) => (
                <tr key={`${q.name}/${r.flavor}/${r.resource}`}>
                  <td>{i === 0 && <code>{q.name}</code>}</td>
                  <td>{i === 0 && <Link href={`/tenants/${encodeURIComponent(q.tenant)}`}>{q.tenant}</Link>}</td>
                  <td>{r.flavor}</td><td>{r.resource}</td>
                  <td className="num">{r.nominalQuota}{r.borrowingLimit && r.borrowingLimit !== "0" ? ` (+${r.borrowingLimit})` : ""}</td>
                  <td className="num">{r.reserved}{r.borrowed !== "0" ? ` (${r.borrowed} borrowed)` : ""}</td>
                  <td className="num">{r.admitted}</td>
                  <td className="num">{i === 0 && `${q.pendingWorkloads} / ${q.reservingWorkloads} / ${q.admittedWorkloads}`}</td>
                  <td>{i === 0 && q.stopPolicy}</td>
                </tr>
              )))}
              {cluster.queues.length === 0 && <tr><td colSpan={9} className="muted">no Kestrel ClusterQueue yet</td></tr>}
            </tbody>
          </table>
        </>
      )}
    </>
  );
}
