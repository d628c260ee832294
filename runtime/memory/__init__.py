"""KV memory, in one place: the request→token table, the token→KV pool and its slot allocator, the radix prefix
cache over them, the per-request cache bookkeeping, device memory probes and the pool-size planning."""
