"""The CPU offloading tier: chunk specs, metrics names, the manager and its cache policies."""
