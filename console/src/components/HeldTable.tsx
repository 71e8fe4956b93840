import Link from "next/link";
import { duration, instant } from "@/lib/format";
import type { Job } from "@/gen/kestrel/v1/common_pb";
import { JobState } from "@/gen/kestrel/v1/common_pb";

/** Jobs with their states, flavors and reasons: admission's held ones by default, or any
 * listing (the operator's ListAllJobs) with the credits each holds. */
export default function HeldTable({ jobs, withTenant = false, withReserved = false, testId = "held-jobs", empty = "No job is held for budget." }: { jobs: Job[]; withTenant?: boolean; withReserved?: boolean; testId?: string; empty?: string }) {
  if (jobs.length === 0) return <p className="muted">{empty}</p>;
  return (
    <table data-testid={testId}>
      <thead><tr><th>job</th>{withTenant && <th>tenant</th>}<th>name</th><th>state</th><th>flavor</th><th>GPUs</th><th>max duration</th><th>priority</th>{withReserved && <th>reserved at admission</th>}<th>{withReserved ? "reason" : "reason (runway check)"}</th><th>submitted</th></tr></thead>
      <tbody>
        {jobs.map((j) => (
          <tr key={j.jobId} data-testid={`job-${j.jobId}`}>
            <td><code>{j.jobId}</code></td>
            {withTenant && <td><Link href={`/tenants/${encodeURIComponent(j.tenant)}`}>{j.tenant}</Link></td>}
            <td>{j.spec?.name}</td>
            <td className={`state-${JobState[j.state]}`} data-testid="state">{JobState[j.state]}</td>
            <td>{j.flavor || j.spec?.flavor || "placer's choice"}{j.flavorReason && <div className="muted">{j.flavorReason}</div>}</td>
            <td className="num">{j.spec?.gpus}</td>
            <td className="num">{j.spec ? duration(Number(j.spec.maxDurationS)) : ""}</td>
            <td className="num">{j.spec?.priority}</td>
            {withReserved && <td className="num">{j.reserved}</td>}
            <td data-testid="reason">{j.reason}</td>
            <td>{instant(j.createdUs)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
