"""The meter: append-only usage ledger, tick metering and live runway."""
