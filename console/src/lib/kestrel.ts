// Server-side only: gRPC clients of the gateway, the meter and admission, generated
// from proto/ (src/gen, `make console-gen`). The operator token is read here, from
// the server's environment, and never leaves this process.
import "server-only";
import { readFileSync } from "node:fs";
import path from "node:path";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Gateway, type Tenant } from "@/gen/kestrel/v1/gateway_pb";
import { Meter, type UsageRow, type Price, type GetTenantSummaryResponse } from "@/gen/kestrel/v1/meter_pb";
import { Admission } from "@/gen/kestrel/v1/admission_pb";
import { Autoscaler, type GetScaleStateResponse } from "@/gen/kestrel/v1/autoscaler_pb";
import { Placer, type ClusterNode, type ClusterQueueView } from "@/gen/kestrel/v1/placer_pb";
import type { Endpoint, Job } from "@/gen/kestrel/v1/common_pb";
import { Code, ConnectError } from "@connectrpc/connect";

type Clients = {
  gateway: Client<typeof Gateway>;
  meter: Client<typeof Meter>;
  admission: Client<typeof Admission>;
  autoscaler: Client<typeof Autoscaler>;
  placer: Client<typeof Placer>;
};

const g = globalThis as unknown as { __kestrelClients?: Clients };

function transport(addr: string) {
  return createGrpcTransport({ baseUrl: `http://${addr}` });
}

export function addresses() {
  return {
    gateway: process.env.KESTREL_GATEWAY_ADDR || "127.0.0.1:50051",
    meter: process.env.KESTREL_METER_ADDR || "127.0.0.1:50053",
    admission: process.env.KESTREL_ADMISSION_ADDR || "127.0.0.1:50052",
    autoscaler: process.env.KESTREL_AUTOSCALER_ADDR || "127.0.0.1:50055",
    placer: process.env.KESTREL_PLACER_ADDR || "127.0.0.1:50054",
  };
}

function clients(): Clients {
  if (!g.__kestrelClients) {
    const a = addresses();
    g.__kestrelClients = {
      gateway: createClient(Gateway, transport(a.gateway)),
      meter: createClient(Meter, transport(a.meter)),
      admission: createClient(Admission, transport(a.admission)),
      autoscaler: createClient(Autoscaler, transport(a.autoscaler)),
      placer: createClient(Placer, transport(a.placer)),
    };
  }
  return g.__kestrelClients;
}

/** KESTREL_OPERATOR_TOKEN, else the file `make up` writes (KESTREL_OPERATOR_TOKEN_FILE). */
function operatorToken(): string {
  const t = process.env.KESTREL_OPERATOR_TOKEN;
  if (t) return t.trim();
  const file = /*turbopackIgnore: true*/ process.env.KESTREL_OPERATOR_TOKEN_FILE
    || path.resolve(process.cwd(), "..", ".run", "plane", "operator-token");
  try {
    return readFileSync(/*turbopackIgnore: true*/ file, "utf8").trim();
  } catch {
    throw new Error(`no operator token: set KESTREL_OPERATOR_TOKEN or KESTREL_OPERATOR_TOKEN_FILE (${file} unreadable)`);
  }
}

const OPTS = () => ({ headers: { authorization: `Bearer ${operatorToken()}` }, timeoutMs: 5000 });
const INTERNAL = { timeoutMs: 5000 };

export async function listTenants(): Promise<Tenant[]> {
  const out: Tenant[] = [];
  let pageToken = "";
  do {
    const r = await clients().gateway.listTenants({ pageSize: 100, pageToken }, OPTS());
    out.push(...r.tenants);
    pageToken = r.nextPageToken;
  } while (pageToken);
  return out.sort((a, b) => a.tenant.localeCompare(b.tenant));
}

export async function getTenant(tenant: string): Promise<Tenant | undefined> {
  const r = await clients().gateway.getTenant({ tenant }, OPTS());
  return r.tenant;
}

/** The meter's runway and per-flavor totals; every figure from ledger rows <= runway.ledgerSeq. */
export async function summary(tenant: string): Promise<GetTenantSummaryResponse> {
  return clients().meter.getTenantSummary({ tenant }, INTERNAL);
}

export type RowFilter = { uptoSeq?: bigint; flavor?: string; workload?: string; limit?: number };

/** Ledger rows of a tenant, oldest first (row id order), up to a ledger sequence. */
export async function usageRows(tenant: string, f: RowFilter = {}): Promise<{ rows: UsageRow[]; truncated: boolean }> {
  const rows: UsageRow[] = [];
  const limit = f.limit ?? 50_000;
  let pageToken = "";
  do {
    const r = await clients().meter.listUsage(
      { tenant, workloadId: f.workload ?? "", pageSize: 1000, pageToken }, INTERNAL);
    for (const row of r.rows) {
      if (f.uptoSeq !== undefined && row.rowId > f.uptoSeq) continue;
      if (f.flavor && row.flavor !== f.flavor) continue;
      rows.push(row);
      if (rows.length >= limit) return { rows, truncated: true };
    }
    pageToken = r.nextPageToken;
  } while (pageToken);
  return { rows, truncated: false };
}

export async function prices(): Promise<Price[]> {
  return (await clients().meter.listPrices({}, INTERNAL)).prices;
}

/** Admission's held jobs of a tenant, in release order, each with the check's reason. */
export async function heldJobs(tenant: string): Promise<Job[]> {
  return (await clients().admission.listHeld({ tenant }, INTERNAL)).jobs;
}

/** The latest `limit` jobs of every tenant (or of one), newest first, any state. */
export async function listAllJobs(tenant = "", limit = 500): Promise<{ jobs: Job[]; truncated: boolean }> {
  // Pages come oldest first: keep the newest `limit` while walking them.
  let jobs: Job[] = [];
  let truncated = false;
  let pageToken = "";
  do {
    const r = await clients().gateway.listAllJobs({ tenant, pageSize: 500, pageToken }, OPTS());
    jobs.push(...r.jobs);
    if (jobs.length > limit) { jobs = jobs.slice(jobs.length - limit); truncated = true; }
    pageToken = r.nextPageToken;
  } while (pageToken);
  return { jobs: jobs.reverse(), truncated };
}

/** Every tenant's endpoints (the gateway's operator ListAllEndpoints), or one tenant's. */
export async function listAllEndpoints(tenant = ""): Promise<Endpoint[]> {
  const out: Endpoint[] = [];
  let pageToken = "";
  do {
    const r = await clients().gateway.listAllEndpoints({ pageSize: 100, pageToken, tenant }, OPTS());
    out.push(...r.endpoints);
    pageToken = r.nextPageToken;
  } while (pageToken);
  return out;
}

/** The autoscaler's last decision for an endpoint: a state, or why there is none
 * (no decision yet, or no autoscaler answering at its address). */
export async function scaleState(tenant: string, endpointId: string): Promise<GetScaleStateResponse | string> {
  try {
    return await clients().autoscaler.getScaleState({ tenant, endpointId }, { timeoutMs: 2000 });
  } catch (e) {
    if (e instanceof ConnectError && e.code === Code.NotFound) return "no decision yet";
    if (e instanceof ConnectError && (e.code === Code.Unavailable || e.code === Code.DeadlineExceeded))
      return `no autoscaler at ${addresses().autoscaler}`;
    throw e;
  }
}

/** The cluster as the placer reads it from the apiserver: nodes and Kestrel's
 * ClusterQueues with Kueue's usage; or why not (no placer: a plane without a cluster). */
export async function clusterView(): Promise<{ nodes: ClusterNode[]; queues: ClusterQueueView[] } | string> {
  try {
    const p = clients().placer;
    const [n, q] = await Promise.all([p.listNodes({}, INTERNAL), p.listClusterQueues({ tenant: "" }, INTERNAL)]);
    return { nodes: n.nodes, queues: q.clusterQueues };
  } catch (e) {
    if (e instanceof ConnectError && (e.code === Code.Unavailable || e.code === Code.DeadlineExceeded))
      return `no placer at ${addresses().placer}: this plane runs without a cluster`;
    throw e;
  }
}

export function describeError(e: unknown): string {
  if (e instanceof Error) return e.message;
  return String(e);
}
