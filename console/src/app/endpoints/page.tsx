import Link from "next/link";
import Live from "@/components/Live";
import Failure from "@/components/Failure";
import { describeError, listAllEndpoints, scaleState } from "@/lib/kestrel";
import { duration, instant, runwayText } from "@/lib/format";

export const dynamic = "force-dynamic";

export default async function EndpointsPage({ searchParams }: { searchParams: Promise<{ tenant?: string }> }) {
  const only = (await searchParams).tenant ?? "";
  let rows;
  try {
    const endpoints = await listAllEndpoints(only);
    rows = await Promise.all(endpoints.map(async (e) => ({ e, s: await scaleState(e.tenant, e.endpointId) })));
  } catch (e) {
    return <><h1>Endpoints</h1><Failure what="Reading endpoints" message={describeError(e)} /></>;
  }
  return (
    <>
      <Live at={new Date().toISOString()} />
      <h1>Endpoints{only && <> of <Link href={`/tenants/${encodeURIComponent(only)}`}>{only}</Link></>}</h1>
      <p className="muted">From the gateway (ListAllEndpoints: live replicas, ready ones by their heartbeats) and the autoscaler (GetScaleState: its target and the reason for it, from load and the tenant&apos;s runway). Replicas on a GPU flavor are <strong>simulated</strong>: KWOK pods, each answered by a host process standing in for it; on <code>cpu</code> they are pods on the real kubelet.</p>
      <table data-testid="endpoints">
        <thead><tr><th>endpoint</th><th>tenant</th><th>name</th><th>model</th><th>flavor</th><th>replicas (ready)</th><th>min..max</th><th>target</th><th>autoscaler&apos;s reason</th><th>runway it saw</th><th>horizon</th><th>created</th></tr></thead>
        <tbody>
          {rows.map(({ e, s }) => (
            <tr key={e.endpointId} data-testid={`endpoint-${e.endpointId}`}>
              <td><code>{e.endpointId}</code></td>
              <td><Link href={`/tenants/${encodeURIComponent(e.tenant)}`}>{e.tenant}</Link></td>
              <td>{e.spec?.name}</td>
              <td>{e.spec?.model}</td>
              <td>{e.spec?.flavor}{e.simulated && <> <span className="badge" data-testid="simulated">simulated</span></>}</td>
              <td className="num" data-testid="replicas">{e.replicas} ({e.readyReplicas}){e.reason && <div className="muted">{e.reason}</div>}</td>
              <td className="num">{e.spec?.minReplicas}..{e.spec?.maxReplicas}{e.spec?.warmPool ? ` +${e.spec.warmPool} warm` : ""}</td>
              <td className="num" data-testid="target">{typeof s === "string" ? "" : s.targetReplicas}</td>
              <td data-testid="scale-reason">{typeof s === "string" ? <span className="muted">{s}</span> : <>{s.reason}<div className="muted">decided {instant(s.decidedUs)}; queue {String(s.inputs?.queueDepth ?? 0)}, p95 {(s.inputs?.p95Ms ?? 0).toFixed(0)} ms</div></>}</td>
              <td>{typeof s === "string" || !s.inputs ? "" : runwayText({ unlimited: s.inputs.runwayUnlimited, runwayS: s.inputs.runwayS })}</td>
              <td className="num">{e.spec?.reservationHorizonS ? duration(Number(e.spec.reservationHorizonS)) : <span className="muted">the gateway&apos;s default</span>}</td>
              <td>{instant(e.createdUs)}</td>
            </tr>
          ))}
          {rows.length === 0 && <tr><td colSpan={12} className="muted">no endpoint{only ? ` of ${only}` : ""}</td></tr>}
        </tbody>
      </table>
      <p className="muted">Replica cost is metered like jobs: each endpoint&apos;s ledger rows are on its tenant&apos;s <Link href="/jobs">jobs</Link> page (a replica is a workload of its own).</p>
    </>
  );
}
