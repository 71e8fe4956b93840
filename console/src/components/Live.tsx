"use client";
// Live updates without reloading: every interval the server components of the page
// are fetched again (an RSC request; the gRPC calls happen on the server).
import { useRouter } from "next/navigation";
import { useEffect, useState } from "react";

export default function Live({ at, everyMs = 2000 }: { at: string; everyMs?: number }) {
  const router = useRouter();
  const [paused, setPaused] = useState(false);
  useEffect(() => {
    if (paused) return;
    const id = setInterval(() => router.refresh(), everyMs);
    return () => clearInterval(id);
  }, [router, everyMs, paused]);
  return (
    <span className="live" data-testid="live">
      <span className={paused ? "dot off" : "dot"} /> {paused ? "paused" : "live"} · data as of{" "}
      <time data-testid="as-of">{at}</time>{" "}
      <button type="button" onClick={() => setPaused(!paused)}>{paused ? "resume" : "pause"}</button>
    </span>
  );
}
