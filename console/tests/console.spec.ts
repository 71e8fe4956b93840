import { test, expect, kestrel, plane, screenshot, url } from "./fixtures";
import { parseDec, sumDec } from "../src/lib/decimal";

const VIEWS: [string, string, RegExp][] = [
  ["tenants", "/", /Tenants/],
  ["tenant-acme", "/tenants/acme", /Tenant acme/],
  ["tenant-live", "/tenants/live", /Tenant live/],
  ["tenant-tiny", "/tenants/tiny", /Tenant tiny/],
  ["ledger-acme", "/ledger/acme", /Ledger rows of/],
  ["jobs", "/jobs", /Jobs/],
  ["prices", "/prices", /Prices/],
  ["endpoints", "/endpoints", /Endpoints/],
  ["cluster", "/cluster", /Cluster/],
];

for (const [name, path, title] of VIEWS) {
  const live = path.startsWith("/ledger/") ? "" : ", refreshes live"; // a ledger page is a snapshot at one sequence
  test(`view ${name} (${path}) loads${live}, without errors`, async ({ page }) => {
    await page.goto(url(path));
    await expect(page.locator("h1")).toHaveText(title);
    await expect(page.getByTestId("error")).toHaveCount(0);
    if (live) {
      // One live refresh (every 2 s) must happen without a reload or an error.
      const before = await page.getByTestId("as-of").textContent();
      await expect(page.getByTestId("as-of")).not.toHaveText(before!, { timeout: 8000 });
    }
    const html = await page.content();
    expect(html).not.toContain(process.env.KESTREL_OPERATOR_TOKEN_FOR_LEAK_CHECK!);
    await screenshot(page, name);
  });
}

test("the runway a tenant page shows equals the meter's figure", async ({ page }) => {
  for (const tenant of plane().tenants) {
    // Ticks move charged: compare at one ledger sequence (the CLI read before and after
    // the page agree on it), retrying when a tick fell in between.
    let done = false;
    for (let attempt = 0; attempt < 10 && !done; attempt++) {
      const before = kestrel("runway", tenant).runway;
      await page.goto(url(`/tenants/${tenant}`));
      const shown = {
        runwayS: await page.getByTestId("runway-s").textContent(),
        charged: await page.getByTestId("charged").textContent(),
        reserved: await page.getByTestId("reserved").textContent(),
        remaining: await page.getByTestId("remaining").textContent(),
        credits: await page.getByTestId("credits").textContent(),
        seq: await page.getByTestId("ledger-seq").textContent(),
      };
      const after = kestrel("runway", tenant).runway;
      if (before.ledger_seq !== after.ledger_seq || shown.seq !== after.ledger_seq) continue;
      expect(shown.runwayS).toBe(after.unlimited ? "unlimited" : String(after.runway_s));
      for (const k of ["charged", "reserved", "remaining", "credits"] as const) {
        expect(parseDec(shown[k]!), `${tenant} ${k}`).toBe(parseDec(after[k]));
      }
      done = true;
    }
    expect(done, `${tenant}: a stable ledger sequence to compare at`).toBe(true);
  }
  const live = kestrel("runway", "live").runway;
  expect(live.unlimited).toBe(false); // one finite runway is among those compared
});

for (const tenant of ["acme", "live"]) {
  test(`clicking ${tenant}'s charged figure shows the rows that sum to it`, async ({ page }) => {
    await page.goto(url(`/tenants/${tenant}`));
    const charged = (await page.getByTestId("charged").textContent())!;
    const gpuS = (await page.getByTestId("gpu-seconds").textContent())!;
    expect(parseDec(charged)).toBeGreaterThan(0n);
    await page.getByTestId("charged").click();
    await expect(page.locator("h1")).toContainText("Ledger rows of");
    const costs = await page.getByTestId("row-cost").allTextContents();
    expect(costs.length).toBeGreaterThan(0);
    expect(parseDec(sumDec(costs))).toBe(parseDec(charged));
    const gpu = await page.getByTestId("row-gpu-s").allTextContents();
    expect(parseDec(sumDec(gpu))).toBe(parseDec(gpuS));
    expect(parseDec((await page.getByTestId("rows-sum-cost").textContent())!)).toBe(parseDec(charged));
    await expect(page.getByTestId("figure-match")).toHaveText("= Σ of these rows");
    if (tenant === "acme") {
      // 1 GPU for 10 s at 0.01 per GPU-second, as the plane's events said.
      expect(parseDec(sumDec(gpu))).toBe(parseDec("10"));
      expect(parseDec(charged)).toBe(parseDec("0.1"));
      await screenshot(page, "ledger-acme-charged");
    }
  });
}

test("a held job shows the runway check's reason", async ({ page }) => {
  const { jobs, held_reason } = plane();
  for (const path of ["/jobs", "/tenants/tiny"]) {
    await page.goto(url(path));
    const row = page.getByTestId("held-jobs").getByTestId(`job-${jobs.tiny_held}`);
    await expect(row.getByTestId("state")).toHaveText("HELD");
    await expect(row.getByTestId("reason")).toHaveText(held_reason);
    await expect(row.getByTestId("reason")).toContainText("held until");
  }
});

test("a top-up shows on the open page without a reload", async ({ page }) => {
  await page.goto(url("/tenants/live"));
  const credits = (await page.getByTestId("credits").textContent())!;
  // A reload would lose this mark; router.refresh() keeps the document.
  await page.evaluate(() => { (window as unknown as { mark: number }).mark = 42; });
  kestrel("top-up", "live", "5");
  const want = (parseDec(credits) + parseDec("5")).toString();
  await expect.poll(async () => parseDec((await page.getByTestId("credits").textContent())!).toString(),
    { timeout: 10_000 }).toBe(want);
  expect(await page.evaluate(() => (window as unknown as { mark?: number }).mark)).toBe(42);
});

test("an endpoint shows its replicas, why none is ready, and the autoscaler's decision", async ({ page }) => {
  const { endpoint } = plane();
  await page.goto(url("/endpoints"));
  const row = page.getByTestId(`endpoint-${endpoint}`);
  await expect(row).toContainText("acme");
  await expect(row).toContainText("embed");
  // A GPU flavor, but this plane has no cluster: its replicas would be host processes
  // started by hand, not KWOK pods with stand-ins, so nothing is labelled simulated.
  await expect(row.getByTestId("simulated")).toHaveCount(0);
  await expect(row.getByTestId("replicas")).toContainText("0 (0)");
  await expect(row.getByTestId("replicas")).toContainText("replicas are host processes");
  // The plane's autoscaler decides within a few of its 1 s cycles (once it has seen acme's
  // runway); the page picks that up on a live refresh. No load, minimum 0: it stays at 0.
  await expect(row.getByTestId("scale-reason")).toHaveText(/^hold/, { timeout: 20_000 });
  await expect(row.getByTestId("target")).toHaveText("0");
});

test("the jobs view lists every tenant's jobs in every state", async ({ page }) => {
  const { jobs, held_reason } = plane();
  await page.goto(url("/jobs"));
  const all = page.getByTestId("all-jobs");
  for (const id of Object.values(jobs)) await expect(all.getByTestId(`job-${id}`)).toHaveCount(1);
  await expect(all.getByTestId(`job-${jobs.tiny_held}`).getByTestId("state")).toHaveText("HELD");
  await expect(all.getByTestId(`job-${jobs.tiny_held}`).getByTestId("reason")).toHaveText(held_reason);
  await expect(all.getByTestId(`job-${jobs.tiny_admitted}`).getByTestId("state")).toHaveText("ADMITTED");
  // The seeded finish event (the placer's, published by the plane) reached admission.
  await expect(all.getByTestId(`job-${jobs.acme}`).getByTestId("state")).toHaveText("SUCCEEDED");
});

test("the cluster view says why it has no nodes when the plane has no placer", async ({ page }) => {
  // The test plane runs without Kubernetes (tests/e2e/test_placer.py covers ListNodes and
  // ListClusterQueues on the real cluster): the page says so instead of failing.
  await page.goto(url("/cluster"));
  await expect(page.getByTestId("no-placer")).toContainText("no placer at");
  await expect(page.getByTestId("quotas")).toContainText("acme");
});
