import type { Metadata } from "next";
import Link from "next/link";
import "./globals.css";

export const metadata: Metadata = { title: "Kestrel console", description: "Kestrel operator console" };

export default function RootLayout({ children }: { children: React.ReactNode }) {
  return (
    <html lang="en">
      <body>
        <header>
          <strong>Kestrel</strong>
          <Link href="/">Tenants</Link>
          <Link href="/jobs">Jobs</Link>
          <Link href="/prices">Prices</Link>
          <Link href="/endpoints">Endpoints</Link>
          <Link href="/cluster">Cluster</Link>
        </header>
        <main>{children}</main>
      </body>
    </html>
  );
}
