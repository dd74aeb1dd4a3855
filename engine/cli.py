"""The engine's command line: generate, bench, export, prepare, draft-vocab, devices.

`dflash-studio` (the launcher, dflash_studio/) opens the desktop app for no subcommand or `gui`,
and runs this for everything else; engine/ itself never imports the app.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.console import progress_printer
from engine.errors import DFlashError


def _resolve_models(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(target, draft) for generate and serve: the catalogue's first draft when --draft is not given."""
    from engine.catalog import resolve_models

    target, drafts = resolve_models(args.target, args.draft)
    return target, (drafts[0] if drafts else None)


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.api import load_engine
    from engine.config import GenerationConfig

    target, draft = _resolve_models(args)
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
        num_assistant_tokens=args.num_assistant_tokens, markov_head_top_k=args.markov_head_top_k,
        stop_strings=list(args.stop or []),
        do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, rng_seed=args.seed)
    config.validate()
    pipe = load_engine(target, draft, device=args.device, precision=args.precision)

    def stream(event) -> None:
        if not args.json:
            print(event.text, end="", flush=True)

    result = pipe.generate(args.prompt, config, chat=args.chat, on_event=stream)
    if args.json:
        out = {"text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
               "cumulative_logprob": result.cumulative_logprob,
               "target": str(target), "draft": str(draft) if draft else None, **result.metrics.as_dict()}
        print(json.dumps(out, ensure_ascii=False))
    else:
        m = result.metrics
        print(f"\n\n[{m.generated_tokens} tokens, {m.target_steps} target steps, {m.tokens_per_step:.2f} tokens/step, "
              f"TTFT {m.ttft_ms:.1f} ms, TPOT {m.tpot_ms:.2f} ms, {m.decode_tok_s:.1f} tok/s, "
              f"draft {m.draft_name or 'none'}]", file=sys.stderr)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    if args.model or args.remove or args.list or args.wheels or args.keep_intermediates:
        from engine.prepare_catalog import prepare_cli

        return prepare_cli(args, progress_printer(args.quiet))
    from engine.prepare import prepare_default

    path = prepare_default(force=args.force, weight_format=args.weight_format, progress=progress_printer(args.quiet))
    print(path)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.kind == "serving":
        from engine.export.serving import run_cli

        return run_cli(args)
    if not args.input:
        raise ValueError(f"export --kind {args.kind} needs --input DIR (the Hugging Face folder).")
    show = progress_printer()
    if args.kind == "target":
        from engine.export.target import export_target

        out = export_target(Path(args.input), Path(args.output), weight_format=args.weight_format,
                            progress=lambda m: show(m))
    else:
        from engine.export.draft import export_draft

        out = export_draft(Path(args.input), Path(args.output), weight_format=args.weight_format)
    print(f"\n{out}", file=sys.stderr)
    return 0


def cmd_draft_vocab(args: argparse.Namespace) -> int:
    """Write draft_vocabulary.json: the draft's lm_head then scores only the most frequent answer tokens."""
    from engine.models.draft_vocab import count_answer_tokens, read_answer_rows, write_draft_vocabulary
    from engine.models.tokenizer import TextTokenizer

    rows: list[list[int]] = []
    for path in args.answers or []:
        rows += read_answer_rows(Path(path), args.field)
    if args.text:
        if not args.target:
            raise ValueError("--text needs --target: the target's tokenizer turns the text into token ids")
        tok = TextTokenizer(Path(args.target))
        rows += [tok.encode(Path(t).read_text(encoding="utf-8"), add_special_tokens=False) for t in args.text]
    if not rows:
        raise ValueError("no answers: give --answers FILE.jsonl[.gz] (token-id rows) and/or --text FILE with --target")
    vocab = args.vocab_size or json.loads((Path(args.draft) / "config.json").read_text()).get("vocab_size")
    if not vocab:
        raise ValueError("the draft's config.json does not say vocab_size: pass --vocab-size")
    held = rows[: args.heldout]
    record = write_draft_vocabulary(Path(args.draft), count_answer_tokens(rows[args.heldout:], int(vocab)), args.size,
                                    source=", ".join(map(str, (args.answers or []) + (args.text or []))),
                                    heldout=count_answer_tokens(held, int(vocab)) if held else None)
    print(f"{record['size']} ids, coverage {record['coverage']:.4f}"
          + (f", held-out coverage {record['heldout_coverage']:.4f}" if "heldout_coverage" in record else ""))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from engine.devices import list_devices

    devices = list_devices()
    if args.json:
        print(json.dumps([d.__dict__ for d in devices]))
    else:
        for d in devices:
            note = f"  ({d.notice})" if d.notice else ""
            print(f"{d.name:8} {d.full_name}{note}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.bench.cli import run_cli

    return run_cli(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-studio", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")

    sub.add_parser("gui", help="open the desktop app (the default); takes --target, --draft, --device")

    def model_args(sp: argparse.ArgumentParser, several_drafts: bool = False) -> None:
        sp.add_argument("--target", help="target OpenVINO folder, or a prepared catalogue model by name "
                                         "(qwen2.5-coder-0.5b; default: the embedded SmolLM2)")
        if several_drafts:
            sp.add_argument("--draft", nargs="+", default=None, metavar="DIR",
                            help="draft folders to compare (default: the best prepared draft; 'none' for the "
                                 "target alone only)")
        else:
            sp.add_argument("--draft", help="draft folder, or 'none' for the target alone (default: the best "
                                             "prepared draft)")
        sp.add_argument("--device", default="CPU", help="OpenVINO device: CPU, GPU, GPU.1 ... (NPU is refused)")
        sp.add_argument("--precision", choices=["default", "f32"], default="default",
                        help="f32 pins exact inference (f32, f32 KV cache, no dynamic quantization)")

    gen = sub.add_parser("generate", help="generate once and print the text (or --json)")
    model_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="apply the chat template (default: when the model has one)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--num-assistant-tokens", type=int, default=None, help="candidates per step (default: block-1)")
    gen.add_argument("--markov-head-top-k", type=int, default=None,
                     help="drafts with a Markov head: K of the Top-K scorer (0 = dense walk, DSpark only)")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--min-new-tokens", type=int, default=0)
    gen.add_argument("--do-sample", action="store_true", help="sample (exact rejection sampling verifies drafts)")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--presence-penalty", type=float, default=0.0)
    gen.add_argument("--frequency-penalty", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None, help="random seed (sampling)")
    gen.add_argument("--json", action="store_true")
    gen.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="benchmark this engine against openvino_genai on the same IR")
    model_args(b, several_drafts=True)
    from engine.bench.cli import add_bench_args

    add_bench_args(b)
    b.set_defaults(func=cmd_bench)

    e = sub.add_parser("export", help="export a Hugging Face folder to OpenVINO")
    e.add_argument("--kind", choices=["target", "draft", "serving"], required=True,
                   help="serving: a draft as the checkpoint vLLM / SGLang load, with their launch command")
    e.add_argument("--input", help="Hugging Face checkpoint folder (target, draft)")
    e.add_argument("--target", help="serving: the target's folder (default: the embedded SmolLM2)")
    e.add_argument("--draft", help="serving: the draft checkpoint (or its exported IR)")
    e.add_argument("--engine", choices=["vllm", "sglang"], help="serving: the engine the README launches")
    e.add_argument("--output", required=True, help="OpenVINO folder to write")
    e.add_argument("--weight-format", default=None, help="int4|int8|fp16|fp32 (target default int8, draft fp32)")
    e.set_defaults(func=cmd_export)

    pr = sub.add_parser("prepare", help="build the embedded default models (or --model NAME) into the user data folder")
    pr.add_argument("--force", action="store_true", help="rebuild even if prepared")
    pr.add_argument("--weight-format", default="int8", choices=["int8", "fp16", "fp32"])
    pr.add_argument("--quiet", action="store_true")
    from engine.prepare_catalog import add_prepare_args

    add_prepare_args(pr)
    pr.set_defaults(func=cmd_prepare)

    v = sub.add_parser("draft-vocab", help="write a draft's sub-vocabulary (its lm_head then scores only those tokens)")
    v.add_argument("--draft", required=True, help="draft folder (exported, or the checkpoint it is exported from)")
    v.add_argument("--answers", nargs="+", help="JSONL(.gz) files of the target's answers as token ids")
    v.add_argument("--field", default="answer", help="the token-id field of each JSONL object")
    v.add_argument("--text", nargs="+", help="text files of the target's answers (tokenized with --target's tokenizer)")
    v.add_argument("--target", help="target folder (for --text)")
    v.add_argument("--size", type=int, default=16384, help="tokens to keep, most frequent first")
    v.add_argument("--vocab-size", type=int, help="the target's vocabulary size (default: the draft's config.json)")
    v.add_argument("--heldout", type=int, default=0, help="first N rows held out to report coverage")
    v.set_defaults(func=cmd_draft_vocab)

    from engine.serve.cli import add_parser as add_serve_parser

    add_serve_parser(sub, model_args, _resolve_models)

    try:  # the bundled app ships without the training stack (installer/dflash-studio.spec)
        from engine.training.cli import add_parser as add_train_draft  # torch is imported only when it runs
    except ImportError:
        add_train_draft = None
    if add_train_draft is not None:
        add_train_draft(sub)

    d = sub.add_parser("devices", help="list OpenVINO devices")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_devices)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] == "gui":
        parser.error("the desktop app opens through the launcher: run `dflash-studio` (or `python -m dflash_studio`)")
    args = parser.parse_args(argv)
    if getattr(args, "weight_format", "x") is None:
        args.weight_format = "int8" if args.kind == "target" else "fp32"
    try:
        return args.func(args)
    except (DFlashError, ValueError) as exc:
        print(f"dflash-studio: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
