"""KV memory's parts: the request→token table, the token→KV pool and its slot allocator, the radix prefix cache over
them, device memory probes and the pool-size planning. Putting them together per request is the cache manager's
job, one room up the stream; nothing here imports a request."""
