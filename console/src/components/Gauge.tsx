// Runway gauge: remaining budget as a share of credits (remaining_bp from the meter).
export default function Gauge({ bp, label, size = 120 }: { bp: number; label: string; size?: number }) {
  const frac = Math.max(0, Math.min(1, bp / 10000));
  const r = 45;
  const c = Math.PI * r; // half circle
  const color = frac < 0.1 ? "#d33" : frac < 0.3 ? "#e90" : "#2a7";
  return (
    <svg width={size} height={size * 0.62} viewBox="0 0 100 62" role="img" aria-label={`remaining ${(frac * 100).toFixed(1)}%`}>
      <path d="M5 55 A45 45 0 0 1 95 55" fill="none" stroke="#ddd" strokeWidth="9" />
      <path d="M5 55 A45 45 0 0 1 95 55" fill="none" stroke={color} strokeWidth="9"
        strokeDasharray={`${c * frac} ${c}`} />
      <text x="50" y="44" textAnchor="middle" fontSize="13" fontWeight="bold">{(frac * 100).toFixed(1)}%</text>
      <text x="50" y="60" textAnchor="middle" fontSize="7">{label}</text>
    </svg>
  );
}
