// Exact decimal arithmetic on the wire's money strings ("12.5", "0.000300000"):
// the ledger never uses floats, and neither does a sum shown next to a figure.
const SCALE = 18;
const ONE = 10n ** BigInt(SCALE);

export function parseDec(s: string): bigint {
  const t = (s || "0").trim();
  const neg = t.startsWith("-");
  const body = neg || t.startsWith("+") ? t.slice(1) : t;
  const [whole, frac = ""] = body.split(".");
  if (!/^\d*$/.test(whole) || !/^\d*$/.test(frac) || frac.length > SCALE) {
    throw new Error(`not a decimal: ${JSON.stringify(s)}`);
  }
  const v = BigInt(whole || "0") * ONE + BigInt((frac + "0".repeat(SCALE)).slice(0, SCALE) || "0");
  return neg ? -v : v;
}

export function fmtDec(v: bigint): string {
  const neg = v < 0n;
  const a = neg ? -v : v;
  const whole = a / ONE;
  const frac = (a % ONE).toString().padStart(SCALE, "0").replace(/0+$/, "");
  return `${neg ? "-" : ""}${whole}${frac ? "." + frac : ""}`;
}

export function sumDec(xs: Iterable<string>): string {
  let t = 0n;
  for (const x of xs) t += parseDec(x);
  return fmtDec(t);
}

/** "12.500" and "12.5" are the same amount. */
export function sameDec(a: string, b: string): boolean {
  return parseDec(a) === parseDec(b);
}

export function normDec(s: string): string {
  return fmtDec(parseDec(s));
}

/** GPU-microseconds as exact GPU-seconds ("12.000001"). */
export function gpuSeconds(gpuUs: bigint): string {
  return fmtDec(gpuUs * 10n ** BigInt(SCALE - 6));
}

export function toNumber(s: string): number {
  return Number(s || "0");
}
