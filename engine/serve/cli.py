"""`dflash-studio serve`: the OpenAI-compatible server on the command line (docs/serving.md)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from engine.draft_policy import DEFAULT_POLICY, POLICIES
from engine.scheduler import WINDOW_MODELS_MB
from engine.serve import DEFAULT_MAX_QUEUE, DEFAULT_MAX_RUNNING

API_KEY_ENV = "DFLASH_STUDIO_API_KEY"


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def add_parser(sub: argparse._SubParsersAction, model_args: Callable[[argparse.ArgumentParser], None],
               resolve_models: Callable[[argparse.Namespace], tuple]) -> None:
    """`serve` with the shared model options; `resolve_models` gives (target, draft) as `generate` does."""
    s = sub.add_parser("serve", help="an OpenAI-compatible server (/v1/chat/completions ...) on this machine")
    model_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; others need --api-key)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"clients must send 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)")
    s.add_argument("--max-queue", type=_non_negative, default=DEFAULT_MAX_QUEUE,
                   help="requests that may wait behind the running ones; more are answered 429 at once")
    s.add_argument("--max-running", type=_positive, default=DEFAULT_MAX_RUNNING,
                   help="requests the engine runs in the same steps (its max_num_seqs)")
    s.add_argument("--prefix-caching", choices=["on", "off"], default="on",
                   help="reuse the KV of a conversation's earlier turns (docs/batching.md, \"Prefix caching\")")
    s.add_argument("--draft-policy", choices=list(POLICIES), default=DEFAULT_POLICY,
                   help="how many drafted candidates the target verifies: 'adaptive' (default) the ones that pay "
                        "for their rows at the current load (docs/batching.md), 'always' every one")
    s.add_argument("--window-models-mb", type=int, default=WINDOW_MODELS_MB, metavar="MB",
                   help="memory the target's extra compiled copies for the adaptive cut may take (0: none)")
    s.set_defaults(func=lambda args: cmd_serve(args, resolve_models))


def cmd_serve(args: argparse.Namespace, resolve_models: Callable[[argparse.Namespace], tuple]) -> int:
    from engine.api import load_engine
    from engine.scheduler import SchedulerConfig
    from engine.serve.app import create_app
    from engine.serve.bridge import Bridge
    from engine.serve.loop import EngineLoop
    from engine.serve.model import served_model
    from engine.serve.server import UvicornServer, bind_socket, check_bind, url_for

    check_bind(args.host, args.api_key)
    sock = bind_socket(args.host, args.port)  # before the models load: a taken port fails at once
    try:
        target, draft = resolve_models(args)
        print(f"Loading {target.name}" + (f" + {draft.name}" if draft else " (no draft)") + f" on {args.device}…",
              file=sys.stderr, flush=True)
        pipe = load_engine(target, draft, device=args.device, precision=args.precision,
                           scheduler=SchedulerConfig(max_num_seqs=args.max_running,
                                                     prefix_caching=args.prefix_caching == "on",
                                                     draft_policy=args.draft_policy,
                                                     window_models_mb=args.window_models_mb))
        model = served_model(str(target), pipe.describe().draft_name)
    except BaseException:
        sock.close()
        raise
    loop = EngineLoop(pipe, model)
    bridge = Bridge(loop, max_queue=args.max_queue, max_running=args.max_running)
    loop.on_step = bridge.observe_step
    loop.start()
    server = UvicornServer(create_app(bridge, args.api_key), sock)
    url = url_for(args.host, server.port)
    print(f"Serving {model.id} (draft: {model.draft_name or 'none'}, context {model.context}) at {url}\n"
          f"  model name for clients: {model.id}\n"
          f"  OpenAI(base_url=\"{url}\", api_key=\"{'<your key>' if args.api_key else 'none'}\")\n"
          "  Ctrl+C stops (running requests finish first; a second Ctrl+C stops at once).",
          file=sys.stderr, flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl+C it drained for
    finally:
        bridge.close()
        loop.stop()
        sock.close()
    print("Server stopped.", file=sys.stderr, flush=True)
    return 0
