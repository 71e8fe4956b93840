import Live from "@/components/Live";
import Failure from "@/components/Failure";
import { describeError, prices } from "@/lib/kestrel";
import { instant } from "@/lib/format";

export const dynamic = "force-dynamic";

export default async function PricesPage() {
  let list;
  try {
    list = await prices();
  } catch (e) {
    return <><h1>Prices</h1><Failure what="Reading prices" message={describeError(e)} /></>;
  }
  return (
    <>
      <Live at={new Date().toISOString()} />
      <h1>Prices</h1>
      <p className="muted">In force now, per flavor (the meter&apos;s ListPrices); ledger rows carry the price they were charged at.</p>
      <table data-testid="prices">
        <thead><tr><th>flavor</th><th>credits / GPU-second</th><th>credits / GPU-hour</th><th>effective since</th></tr></thead>
        <tbody>
          {list.map((p) => (
            <tr key={p.flavor} data-testid={`price-${p.flavor}`}>
              <td>{p.flavor}</td><td className="num">{p.pricePerGpuS}</td><td className="num">{p.pricePerGpuH}</td><td>{instant(p.effectiveUs)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}
