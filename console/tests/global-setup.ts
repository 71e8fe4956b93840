// Starts a throwaway plane (scripts/fixture_plane.py: devstack + meter, gateway, admission, seeded
// through the public API) and the built console (`next start`) against it; both go at teardown.
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import path from "node:path";
import { createInterface } from "node:readline";

const ROOT = path.resolve(__dirname, "..");
const REPO = path.resolve(ROOT, "..");

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => (a && typeof a === "object" ? resolve(a.port) : reject(new Error("no port"))));
    });
  });
}

function startPlane(): Promise<{ proc: ChildProcess; env: Record<string, unknown> }> {
  const proc = spawn(path.join(REPO, ".venv/bin/python"), [path.join(ROOT, "scripts/fixture_plane.py"), "--tick-s", "5"],
    { cwd: REPO, stdio: ["pipe", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("plane.py printed no JSON within 120 s")), 120_000);
    proc.on("exit", (code) => reject(new Error(`plane.py exited with ${code}`)));
    createInterface({ input: proc.stdout! }).on("line", (line) => {
      if (!line.startsWith("{")) return;
      clearTimeout(timer);
      resolve({ proc, env: JSON.parse(line) });
    });
  });
}

async function waitHttp(url: string, proc: ChildProcess, timeoutMs = 60_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (proc.exitCode !== null) throw new Error(`next start exited with ${proc.exitCode}`);
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${url} not answering after ${timeoutMs} ms`);
}

export default async function globalSetup() {
  const t0 = Date.now();
  const { proc: plane, env } = await startPlane();
  const port = await freePort();
  const consoleEnv = {
    ...process.env,
    KESTREL_GATEWAY_ADDR: String(env.KESTREL_GATEWAY_ADDR),
    KESTREL_METER_ADDR: String(env.KESTREL_METER_ADDR),
    KESTREL_ADMISSION_ADDR: String(env.KESTREL_ADMISSION_ADDR),
    KESTREL_AUTOSCALER_ADDR: String(env.KESTREL_AUTOSCALER_ADDR),
    // The plane has no cluster, hence no placer: an address nothing listens on, so a
    // placer some other plane runs on the default port is not read by mistake.
    KESTREL_PLACER_ADDR: `127.0.0.1:${await freePort()}`,
    KESTREL_OPERATOR_TOKEN: String(env.KESTREL_OPERATOR_TOKEN),
  };
  const next = spawn(path.join(ROOT, "node_modules/.bin/next"), ["start", "-H", "127.0.0.1", "-p", String(port)],
    { cwd: ROOT, env: consoleEnv, stdio: ["ignore", "inherit", "inherit"] });
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitHttp(`${url}/prices`, next);
  } catch (e) {
    next.kill("SIGTERM");
    plane.stdin!.end();
    throw e;
  }
  // Workers inherit these; the operator token stays out of the browser (the tests never send it).
  process.env.CONSOLE_URL = url;
  process.env.KESTREL_METER_ADDR = String(env.KESTREL_METER_ADDR);
  process.env.KESTREL_PLANE = JSON.stringify({ ...env, KESTREL_OPERATOR_TOKEN: undefined });
  process.env.KESTREL_OPERATOR_TOKEN_FOR_LEAK_CHECK = String(env.KESTREL_OPERATOR_TOKEN);
  console.log(`plane and console up in ${((Date.now() - t0) / 1000).toFixed(1)} s: ${url}`);
  return async () => {
    next.kill("SIGTERM");
    plane.stdin!.end(); // plane.py tears the services and the devstack down on end of stdin
    await new Promise<void>((resolve) => {
      if (plane.exitCode !== null) return resolve();
      const t = setTimeout(() => { plane.kill("SIGKILL"); resolve(); }, 30_000);
      plane.on("exit", () => { clearTimeout(t); resolve(); });
    });
  };
}
