"""Constrained decoding: what a request asks its output to match (`spec`, torch-free), the grammar engines behind
`--grammar-backend` (`backend`), the queue that compiles grammars off the scheduler's step with a cache by key
(`grammar_queue`), and the one token bitmask per step for the batch (`bitmask`)."""
