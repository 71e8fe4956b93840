import Live from "@/components/Live";
import Failure from "@/components/Failure";
import { describeError, listTenants } from "@/lib/kestrel";

export const dynamic = "force-dynamic";

export default async function EndpointsPage() {
  let n;
  try {
    n = (await listTenants()).length;
  } catch (e) {
    return <><h1>Endpoints</h1><Failure what="Reading tenants" message={describeError(e)} /></>;
  }
  return (
    <>
      <Live at={new Date().toISOString()} />
      <h1>Endpoints</h1>
      <div className="missing" data-testid="missing-endpoints">
        <strong>Not available over gRPC to the operator.</strong> The gateway&apos;s
        ListEndpoints and GetEndpoint authenticate a tenant&apos;s API key and answer that
        tenant&apos;s endpoints only; the operator token gets PERMISSION_DENIED/UNAUTHENTICATED.
        The autoscaler&apos;s GetScaleState (replicas, target, last reason) needs an endpoint id,
        which only that listing gives. Needed: an operator ListEndpoints on the gateway
        (tenant filter; replicas, ready replicas, target and the autoscaler&apos;s last reason).
        {" "}{n} tenant(s) known.
      </div>
    </>
  );
}
