import { defineConfig } from "@playwright/test";

// Debian's chromium, never a Playwright browser download (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1).
const chromium = process.env.CHROMIUM_PATH || "/usr/bin/chromium";

export default defineConfig({
  testDir: "tests",
  outputDir: "test-results/artifacts",
  globalSetup: "./tests/global-setup.ts",
  fullyParallel: false,
  workers: 1,
  retries: 0,
  timeout: 60_000,
  expect: { timeout: 10_000 },
  reporter: [["list"]],
  use: {
    headless: true,
    viewport: { width: 1280, height: 900 },
    launchOptions: { executablePath: chromium, args: ["--no-sandbox", "--disable-dev-shm-usage"] },
    trace: "retain-on-failure",
    screenshot: "only-on-failure",
  },
});
