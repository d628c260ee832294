"""Every limit a request must respect, in one place; the OpenAI and the native endpoints share them.

| limit                      | value                     | beyond it                                            |
|----------------------------|---------------------------|------------------------------------------------------|
| request body               | 8 MiB                     | 413, param `body`                                    |
| JSON nesting               | 32 levels                 | 400, param `body`                                    |
| one JSON number            | 1000 characters           | 400, param `body`                                    |
| `n`                        | 1 … 128                   | 400, param `n` / `sampling_params.n`                 |
| sequences per request      | 1024 (prompts × n)        | 400, param `n` (or the prompt field when n is 1)     |
| stop strings               | 16, each ≤ 1024 chars     | 400, param `stop` / `sampling_params.stop`           |
| stop token ids             | 256                       | 400, param `stop_token_ids`                          |
| `seed`                     | a signed 64-bit integer   | 400, param `seed`                                    |
| `top_k`                    | -1, or 1 … 2**31 − 1      | 400, param `top_k` (above the vocabulary = all)      |
| `temperature`              | 0 … 2                     | 400, param `temperature`                             |
| `logprobs` / `top_logprobs`| 0 … 20                    | 400, the field                                       |
| a grammar (schema, regex…) | 65536 characters          | 400, the field                                       |
| regex / EBNF nesting       | 1000 parentheses deep     | 400, the field                                       |
| `logit_bias`               | 1024 entries in [-100,100]| 400, param `logit_bias`                              |
| `tools`                    | 128 functions             | 400, param `tools`                                   |

Text fields must be valid Unicode (no lone surrogates such as `"\\ud800"`). This module is plain constants: the
torch-free sampling-parameter check (`SamplingParams.verify`) and the HTTP parsing read them; the sampler does
not rely on them (it takes any seed modulo 2**64 and any top_k above the vocabulary as the whole vocabulary).
"""
from __future__ import annotations

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_JSON_DEPTH = 32
MAX_NUMBER_CHARS = 1000

MAX_N = 128
MAX_SEQUENCES = 1024
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 256
MAX_LOGPROBS = 20

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
TOP_K_MAX = 2**31 - 1
TEMPERATURE_MAX = 2.0
MAX_GRAMMAR_CHARS = 65536
MAX_GRAMMAR_NESTING = 1000  # parentheses in a regex or EBNF grammar (xgrammar's own limit; deeper ones take minutes)
MAX_LOGIT_BIAS = 1024
MAX_TOOLS = 128
LOGIT_BIAS_MAX = 100.0
