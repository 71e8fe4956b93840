// Burn-down: credits minus the cumulative cost of the ledger rows, over the rows' end
// instants, then the projection at the current burn until the money runs out.
import { parseDec, fmtDec } from "@/lib/decimal";
import { duration } from "@/lib/format";

export type Point = { tUs: number; cost: string };

export default function BurnDown({ credits, points, asOfUs, burnPerS, moneyRunwayS, unlimited }: {
  credits: string; points: Point[]; asOfUs: number; burnPerS: number; moneyRunwayS: number; unlimited: boolean;
}) {
  if (points.length === 0) {
    return <p className="muted" data-testid="burndown-empty">No ledger rows yet: nothing has been charged, the budget is untouched.</p>;
  }
  const sorted = [...points].sort((a, b) => a.tUs - b.tUs);
  const creditsN = Number(credits);
  let cum = 0n;
  const series: { t: number; left: number }[] = [{ t: sorted[0].tUs, left: creditsN }];
  for (const p of sorted) {
    cum += parseDec(p.cost);
    series.push({ t: p.tUs, left: Number(fmtDec(parseDec(credits) - cum)) });
  }
  const last = series[series.length - 1];
  const projEnd = !unlimited && burnPerS > 0
    ? { t: asOfUs + Math.min(moneyRunwayS, 3600 * 24) * 1e6, left: Math.max(0, last.left - burnPerS * Math.min(moneyRunwayS, 86400)) }
    : null;
  const t0 = series[0].t;
  const t1 = Math.max(projEnd ? projEnd.t : last.t, asOfUs, t0 + 1);
  const lo = Math.min(0, ...series.map((s) => s.left));
  const hi = Math.max(creditsN, ...series.map((s) => s.left), 1e-12);
  const W = 600, H = 200, P = 36;
  const x = (t: number) => P + ((t - t0) / (t1 - t0)) * (W - 2 * P);
  const y = (v: number) => H - P + -((v - lo) / (hi - lo)) * (H - 2 * P);
  const line = series.map((s) => `${x(s.t).toFixed(1)},${y(s.left).toFixed(1)}`).join(" ");
  return (
    <figure className="chart" data-testid="burndown">
      <svg viewBox={`0 0 ${W} ${H}`} width="100%" role="img" aria-label="burn-down">
        <line x1={P} y1={y(0)} x2={W - P} y2={y(0)} stroke="#bbb" />
        <line x1={P} y1={P / 2} x2={P} y2={H - P} stroke="#bbb" />
        <text x={P - 4} y={y(hi) + 4} textAnchor="end" fontSize="10">{hi.toPrecision(4)}</text>
        <text x={P - 4} y={y(0) + 4} textAnchor="end" fontSize="10">0</text>
        <polyline points={line} fill="none" stroke="#26c" strokeWidth="2" />
        {series.slice(-200).map((s, i) => <circle key={i} cx={x(s.t)} cy={y(s.left)} r="2.5" fill="#26c" />)}
        <line x1={x(asOfUs)} y1={P / 2} x2={x(asOfUs)} y2={H - P} stroke="#999" strokeDasharray="2 3" />
        <text x={x(asOfUs) + 3} y={P / 2 + 8} fontSize="10" fill="#666">now</text>
        {projEnd && (
          <line x1={x(Math.max(last.t, asOfUs))} y1={y(last.left)} x2={x(projEnd.t)} y2={y(projEnd.left)}
            stroke="#c62" strokeWidth="1.5" strokeDasharray="5 4" />
        )}
        <text x={P} y={H - 8} fontSize="10">{new Date(t0 / 1000).toISOString().slice(11, 19)}Z</text>
        <text x={W - P} y={H - 8} fontSize="10" textAnchor="end">{new Date(t1 / 1000).toISOString().slice(11, 19)}Z</text>
      </svg>
      <figcaption className="muted">
        Credits minus the cumulative cost of {points.length} ledger rows (blue);
        {projEnd ? ` projected at the current burn, ${burnPerS} credits/s, for ${duration(moneyRunwayS)} (dashed).` : " nothing burns now."}
        {" "}Credits are drawn at today&apos;s total: the meter exposes no history of top-ups.
      </figcaption>
    </figure>
  );
}
