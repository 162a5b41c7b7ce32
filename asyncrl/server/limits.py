"""What one request may ask of ``asyncrl serve``, and why each bound is where it is.

Standard library only: ``cli.py`` takes its flag defaults from here without the serve extra installed.
Every bound exists so that no single request can stall the other requests or exhaust the server's memory.
"""

from __future__ import annotations

MAX_REQUEST_BYTES = 8 << 20
"""Default request body limit (``--max-request-bytes``). The body is refused with a 413 before it is parsed.
JSON parsing holds the event loop (and the GIL), so this also bounds how long one body can hold every other
endpoint: 8 MiB of the costliest JSON (millions of tiny lists) parses in about half a second on one core."""

MAX_JSON_CONTAINERS = 1 << 18
"""Arrays and objects in one body (``[`` and ``{`` bytes, counted before parsing; brackets inside strings count
too). Parsing a list costs ~7x an integer, so 8 MiB of tiny lists held the event loop for seconds; this many
parse in ~0.1 s, and no request needs more (prompts, chat messages and bucket tensors have smaller bounds)."""

CHARS_PER_TOKEN = 32
"""No tokenizer this engine serves packs more than this many characters into one token on real text, so a
text longer than ``max_len * CHARS_PER_TOKEN`` characters cannot fit ``max_len`` tokens: it is refused before
it is tokenised (tokenising costs ~2.5 s and ~300 MB per MB of text)."""

MAX_PROMPTS = 1024
"""Prompts in one batched request (``input_ids``/``text``/``prompt`` lists): they are all checked before any is
queued, and a bigger batch would only queue behind the engine's slots anyway."""

MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 256
"""Stop strings are matched after every token of every sample, on a decoded tail as long as the longest one:
these bounds keep that per-token work small for every request sharing the engine."""

MAX_STOP_TOKEN_IDS = 1024
"""Stop token ids are matched after every token of every sample."""

MAX_MESSAGES = 4096
"""Chat messages in one request (each costs template rendering before the prompt length can be known)."""

MAX_BUCKET_TENSORS = 1 << 16
MAX_TENSOR_DIMS = 8
"""One ``/update_weights_from_distributed`` bucket: tensors, and dimensions of each tensor."""

MAX_VERSION = 2**63 - 1
"""Weight versions are int64 (0 .. 2**63 - 1) everywhere they are stored."""

UPDATE_TIMEOUT_S = 600.0
"""Default ``--update-timeout``: loading or receiving one weight version."""

GROUP_TIMEOUT_S = 30.0
"""Default ``--group-timeout``: joining a weight update group (``/init_weights_update_group``). Short, because
a trainer that is not listening will not start listening later, and the caller waits for the answer."""

SHUTDOWN_GRACE_S = 3.0
"""On SIGTERM/SIGINT, how long requests still running may take to finish before they are cancelled."""

KV_MEMORY_FRACTION = 0.5
"""At start-up, a KV cache above this fraction of physical memory is refused: the weights, the tokenizer and
the requests need the rest."""

HEADER_TIMEOUT_S = 10.0
"""A connection whose request line and headers are not complete within this many seconds is closed (slow-header
connections otherwise hold a slot for ever)."""

BODY_STALL_S = 30.0
"""A request body that sends nothing for this many seconds gets a 408 and its connection closed."""
