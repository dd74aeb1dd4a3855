"""A local OpenAI-compatible server over the speculative engine (docs/serving.md).

Imports no Qt and nothing from app/: it drives an engine through the small step-loop interface in
`engine.serve.loop`, which the command line (its own thread) and the app (its worker) both provide.
"""

DEFAULT_MAX_QUEUE = 64  # requests that may wait behind the running ones (--max-queue)
DEFAULT_MAX_RUNNING = 16  # requests run in the same steps: engine.scheduler.SchedulerConfig.max_num_seqs
