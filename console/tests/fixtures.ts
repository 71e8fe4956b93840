import { test as base, expect, type Page } from "@playwright/test";
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import path from "node:path";

export const REPO = path.resolve(__dirname, "..", "..");
export const SCREENS = path.resolve(__dirname, "..", "test-results", "screens");

export type PlaneEnv = {
  KESTREL_METER_ADDR: string; tenants: string[]; held_reason: string; endpoint: string;
  jobs: { acme: string; tiny_admitted: string; tiny_held: string; live: string };
};

export const plane = (): PlaneEnv => JSON.parse(process.env.KESTREL_PLANE!);
export const url = (p: string) => `${process.env.CONSOLE_URL}${p}`;

/** The CLI, as an operator would run it: `kestrel -o json meter ...`. */
export function kestrel(...args: string[]): any {
  const out = execFileSync(path.join(REPO, ".venv/bin/kestrel"),
    ["meter", ...args, "-o", "json", "--meter", plane().KESTREL_METER_ADDR], { cwd: REPO, encoding: "utf8" });
  return JSON.parse(out);
}

export async function screenshot(page: Page, name: string) {
  mkdirSync(SCREENS, { recursive: true });
  await page.screenshot({ path: path.join(SCREENS, `${name}.png`), fullPage: true });
}

/** Every test fails on a console error, an uncaught page error, or a failed request. */
export const test = base.extend<{ errors: string[] }>({
  errors: [async ({ page }, use) => {
    const errors: string[] = [];
    page.on("console", (m) => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
    page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
    page.on("response", (r) => { if (r.status() >= 400) errors.push(`HTTP ${r.status()} ${r.url()}`); });
    await use(errors);
    expect(errors, "browser errors").toEqual([]);
  }, { auto: true }],
});
export { expect };
