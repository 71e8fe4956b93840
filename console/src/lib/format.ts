// Shared by server and client components.
export function duration(s: number): string {
  if (!Number.isFinite(s)) return "∞";
  if (s <= 0) return "0 s";
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function instant(us: bigint | number): string {
  const n = Number(us);
  if (!n) return "—";
  return new Date(n / 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function runwayText(r: { unlimited: boolean; runwayS: number }): string {
  return r.unlimited ? "unlimited (nothing burns)" : duration(r.runwayS);
}
