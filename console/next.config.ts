import type { NextConfig } from "next";

const config: NextConfig = {
  // The gRPC clients (connect-node, http2) run in the Node.js server only.
  serverExternalPackages: ["@connectrpc/connect-node"],
  poweredByHeader: false,
  reactStrictMode: true,
};

export default config;
